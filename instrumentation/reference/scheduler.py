"""A continuous-batching scheduler: every step runs the running decodes plus new prefills.

Each :meth:`ContinuousBatchingScheduler.schedule` call builds one step: one decode token
for every running sequence that finished its prompt, then prompt chunks (chunked prefill)
for running and newly admitted sequences while the step's token budget lasts. Admission is
FIFO and needs KV blocks for the whole prompt (prefix-cache hits are reused). When a
decode cannot get a block, the most recently admitted sequence is preempted (its blocks
freed, requeued at the front, recomputed later), as vLLM does.

Pure bookkeeping: no clock, no sleeping; the engine times the steps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tokenpath.config import AT_LEAST_ONE, validate_fields
from tokenpath.instrumentation.reference.kv_cache import PagedKVCache

DEFAULT_MAX_NUM_SEQS = 64
DEFAULT_MAX_BATCHED_TOKENS = 2048


@dataclass(slots=True)
class Sequence:
    """One request inside the engine."""

    seq_id: str
    prompt_ids: list[int]
    max_tokens: int
    cached_tokens: int = 0  # prompt tokens found in the prefix cache at admission
    computed_tokens: int = 0  # prompt tokens whose KV exists (cached + prefilled)
    output_ids: list[int] = field(default_factory=list)
    admitted: bool = False
    finished: bool = False
    preemptions: int = 0
    lookup_seconds: float = 0.0  # host time spent in prefix-cache lookups
    # prompt tokens whose KV another engine computed and sent (disaggregated decode): at
    # admission they count as cached, all but the last (computed here, as vLLM does)
    remote_tokens: int = 0
    payload: Any = None  # the engine's per-request state

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def in_prefill(self) -> bool:
        return self.computed_tokens < self.prompt_len

    @property
    def context_len(self) -> int:
        return self.computed_tokens + len(self.output_ids)


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    seq: Sequence
    new_tokens: int
    context_before: int  # tokens already in the KV cache for this sequence

    @property
    def completes_prompt(self) -> bool:
        return self.context_before + self.new_tokens >= self.seq.prompt_len


@dataclass(slots=True)
class StepPlan:
    prefills: list[PrefillChunk] = field(default_factory=list)
    decodes: list[Sequence] = field(default_factory=list)
    newly_admitted: list[Sequence] = field(default_factory=list)
    # sequences that filled the whole cache alone: finished now, as vLLM ends a request at
    # its length limit
    out_of_blocks: list[Sequence] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.prefills and not self.decodes

    @property
    def batch_size(self) -> int:
        return len(self.prefills) + len(self.decodes)

    @property
    def tokens(self) -> int:
        return sum(c.new_tokens for c in self.prefills) + len(self.decodes)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = field(default=DEFAULT_MAX_NUM_SEQS, metadata=AT_LEAST_ONE)
    max_batched_tokens: int = field(default=DEFAULT_MAX_BATCHED_TOKENS, metadata=AT_LEAST_ONE)

    def validate(self) -> None:
        validate_fields(self)


class ContinuousBatchingScheduler:
    def __init__(self, kv_cache: PagedKVCache, config: SchedulerConfig | None = None,
                 timer: Callable[[], float] | None = None) -> None:
        self.config = config or SchedulerConfig()
        self.config.validate()
        self.kv = kv_cache
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._timer = timer

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        budget = self.config.max_batched_tokens
        # 1. decodes of running sequences past their prompt; preempt when blocks run out
        for seq in list(self.running):
            if seq.in_prefill or seq not in self.running:
                continue
            while not self.kv.can_append(seq.seq_id):
                victim = self._preemption_victim(seq)
                if victim is None:
                    self._finish(seq)
                    plan.out_of_blocks.append(seq)
                    break
                self._preempt(victim)
            if seq not in self.running or not self.kv.can_append(seq.seq_id) or budget < 1:
                continue
            plan.decodes.append(seq)
            budget -= 1
        plan.decodes = [seq for seq in plan.decodes if seq in self.running]
        budget = self.config.max_batched_tokens - len(plan.decodes)
        # 2. prompt chunks of running sequences still in prefill
        for seq in self.running:
            if budget < 1:
                break
            if seq.in_prefill:
                chunk = min(seq.prompt_len - seq.computed_tokens, budget)
                plan.prefills.append(PrefillChunk(seq, chunk, seq.computed_tokens))
                budget -= chunk
        # 3. admit waiting sequences FIFO while seats, blocks and budget last
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            start = self._timer() if self._timer else 0.0
            allocation = self.kv.allocate(seq.seq_id, seq.prompt_ids)
            if self._timer:
                seq.lookup_seconds += self._timer() - start
            if allocation is None:
                break
            self.waiting.popleft()
            seq.admitted = True
            seq.cached_tokens = max(allocation.cached_tokens,
                                    min(seq.remote_tokens, seq.prompt_len - 1))
            seq.computed_tokens = seq.cached_tokens
            self.running.append(seq)
            plan.newly_admitted.append(seq)
            chunk = min(seq.prompt_len - seq.computed_tokens, budget)
            plan.prefills.append(PrefillChunk(seq, chunk, seq.computed_tokens))
            budget -= chunk
        return plan

    def complete_step(self, plan: StepPlan, next_token: Callable[[Sequence], int]) -> list[
        Sequence
    ]:
        """Apply a finished step; returns the sequences that finished in it."""
        finished: list[Sequence] = []
        for chunk in plan.prefills:
            seq = chunk.seq
            if seq not in self.running:
                continue
            seq.computed_tokens = chunk.context_before + chunk.new_tokens
            if not seq.in_prefill:
                seq.output_ids.append(next_token(seq))  # the prompt's last position samples
                self.kv.append_token(seq.seq_id)
                if len(seq.output_ids) >= seq.max_tokens:
                    finished.append(seq)
        for seq in plan.decodes:
            if seq not in self.running:
                continue
            seq.output_ids.append(next_token(seq))
            self.kv.append_token(seq.seq_id)
            if len(seq.output_ids) >= seq.max_tokens:
                finished.append(seq)
        for seq in finished:
            self._finish(seq)
        return finished

    def abort(self, seq: Sequence) -> None:
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.running:
            self._finish(seq)

    def _finish(self, seq: Sequence) -> None:
        seq.finished = True
        self.running.remove(seq)
        self.kv.free(seq.seq_id)

    def _preemption_victim(self, needing: Sequence) -> Sequence | None:
        for candidate in reversed(self.running):
            if candidate is not needing:
                return candidate
        return None

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.kv.free(seq.seq_id)
        seq.preemptions += 1
        seq.computed_tokens = 0
        seq.prompt_ids = seq.prompt_ids + seq.output_ids  # recompute generated tokens too
        seq.max_tokens -= len(seq.output_ids)
        seq.output_ids = []
        seq.admitted = False
        self.waiting.appendleft(seq)
