"""The simulated engine: continuous batching over a paged KV cache, timed by a roofline.

Each step is planned by :class:`ContinuousBatchingScheduler`, timed by
:meth:`tokenpath.roofline.Roofline.step_seconds` (weights streamed once per step plus the
sequences' FLOPs and KV bytes) and slept for that long times ``time_scale`` (0.01 runs a
hundred times faster than the modeled GPU). The engine hook API
(:class:`EngineRequestTrace`) records what the engine measures; each finished request
emits a vLLM-compatible ``llm_request`` span labelled simulated, and, when a
:class:`GroundTruthWriter` is given, its ground-truth GPU seconds and dollars.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import time
import uuid
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field

from opentelemetry.trace import TracerProvider

from tokenpath.config import AT_LEAST_ONE, ConfigError, check, validate_fields
from tokenpath.instrumentation.engine_trace import EngineIdentity, EngineRequestTrace, get_tracer
from tokenpath.instrumentation.fingerprints import FingerprintConfig, prefix_fingerprints
from tokenpath.instrumentation.reference import SIMULATED_ENGINE_NAME
from tokenpath.instrumentation.reference.ground_truth import (
    DEFAULT_GPU_DOLLARS_PER_HOUR,
    GroundTruthWriter,
)
from tokenpath.instrumentation.reference.kv_cache import (
    DEFAULT_BLOCK_TOKENS,
    DEFAULT_NUM_BLOCKS,
    PagedKVCache,
)
from tokenpath.instrumentation.reference.kv_events import KvEventPublisher
from tokenpath.instrumentation.reference.scheduler import (
    DEFAULT_MAX_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    ContinuousBatchingScheduler,
    SchedulerConfig,
    Sequence,
    StepPlan,
)
from tokenpath.instrumentation.reference.tokenizer import TOY_VOCAB_SIZE
from tokenpath.instrumentation.safety import telemetry_errors
from tokenpath.roofline import GPUS, MODELS, Roofline, roofline_for
from tokenpath.stages import Phase

DEFAULT_GPU = "H100-SXM"
DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_TIME_SCALE = 1.0
DEFAULT_NODE = "sim-node"  # replica i runs on "<node>-<i>"
DEFAULT_POOL = "sim-pool"
ROLE_PREFILL = "prefill"
ROLE_DECODE = "decode"
ENGINE_ROLES = (None, ROLE_PREFILL, ROLE_DECODE)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    gpu: str = DEFAULT_GPU
    model: str = DEFAULT_MODEL
    tensor_parallel: int = field(default=1, metadata=AT_LEAST_ONE)
    replica: str = "replica-0"
    node: str = DEFAULT_NODE
    pool: str = DEFAULT_POOL
    kv_blocks: int = DEFAULT_NUM_BLOCKS
    kv_block_tokens: int = DEFAULT_BLOCK_TOKENS
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS
    time_scale: float = field(default=DEFAULT_TIME_SCALE,
                              metadata=check(gt=0, message="must be greater than 0"))
    gpu_dollars_per_hour: float = field(default=DEFAULT_GPU_DOLLARS_PER_HOUR,
                                        metadata=check(ge=0, message="must not be negative"))
    fingerprints: FingerprintConfig = field(default_factory=FingerprintConfig)
    # Where to publish KV-cache events as vLLM does (a ZeroMQ endpoint the node agent
    # binds, ``tokenpath agent --kv-events``); the topic is the replica's name.
    kv_events_endpoint: str | None = None
    # disaggregated serving: "prefill" or "decode"; None: both
    role: str | None = field(default=None, metadata=check(
        one_of=ENGINE_ROLES, optional=True, message="must be prefill, decode or none"))

    def validate(self) -> None:
        if self.gpu not in GPUS:
            raise ConfigError("gpu", f"unknown GPU {self.gpu!r}; known: {', '.join(GPUS)}")
        if self.model not in MODELS:
            raise ConfigError("model", f"unknown model {self.model!r}; known: {', '.join(MODELS)}")
        validate_fields(self)
        SchedulerConfig(self.max_num_seqs, self.max_batched_tokens).validate()
        self.fingerprints.validate()


@dataclass(slots=True)
class _RequestState:
    trace: EngineRequestTrace
    tokens: asyncio.Queue[int | None]
    gpu_seconds: float = 0.0
    emitted: int = 0
    done: bool = False
    kv_received_tokens: int = 0  # a disaggregated decode: the prompt KV it was sent


class EngineOverloaded(RuntimeError):
    """The prompt can never fit in this engine's KV cache."""


class SimulatedEngine:
    """One engine replica. Lives on the event loop that first calls :meth:`generate`."""

    def __init__(self, config: EngineConfig | None = None,
                 tracer_provider: TracerProvider | None = None,
                 ground_truth: GroundTruthWriter | None = None) -> None:
        self.config = config or EngineConfig()
        self.config.validate()
        self.roofline: Roofline = roofline_for(
            self.config.gpu, self.config.model, self.config.tensor_parallel
        )
        self.kv = PagedKVCache(self.config.kv_blocks, self.config.kv_block_tokens)
        self._kv_events: KvEventPublisher | None = None
        if self.config.kv_events_endpoint is not None:
            self.kv.record_events()
            self._kv_events = KvEventPublisher(self.config.kv_events_endpoint,
                                               self.config.replica, self.config.kv_block_tokens)
        self.scheduler = ContinuousBatchingScheduler(
            self.kv, SchedulerConfig(self.config.max_num_seqs, self.config.max_batched_tokens),
            timer=time.perf_counter,
        )
        self.identity = EngineIdentity(
            model=self.config.model, engine=SIMULATED_ENGINE_NAME, replica=self.config.replica,
            node=self.config.node, pool=self.config.pool, gpu_type=self.config.gpu,
            tensor_parallel=self.config.tensor_parallel, simulated=True,
            role=self.config.role,
        )
        self._tracer = get_tracer(tracer_provider)
        self._ground_truth = ground_truth
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._closed = False
        self._ids = itertools.count()
        self.steps = 0
        self.busy_seconds = 0.0
        self.finished_requests = 0

    @property
    def gpu_dollars_per_second(self) -> float:
        return self.config.gpu_dollars_per_hour / 3600.0 * self.config.tensor_parallel

    @property
    def load(self) -> int:
        """Requests waiting or running (for least-loaded routing)."""
        return len(self.scheduler.waiting) + len(self.scheduler.running)

    async def generate(self, prompt_ids: list[int], max_tokens: int,
                       request_id: str | None = None,
                       trace_headers: Mapping[str, str] | None = None,
                       remote_kv_tokens: int = 0,
                       kv_arrives_in: float = 0.0) -> AsyncGenerator[int, None]:
        """Stream the output token ids of one request. A disaggregated decode is handed
        ``remote_kv_tokens`` of the prompt's KV, computed by a prefill engine, which arrive
        ``kv_arrives_in`` seconds after the request: it waits for them in the queue (as
        vLLM schedules a request once its KV has arrived)."""
        if self._closed:
            raise RuntimeError("engine is shut down")
        if max(1, -(-len(prompt_ids) // self.kv.block_tokens)) + 1 > self.kv.num_blocks:
            raise EngineOverloaded("prompt does not fit in the KV cache")
        self._ensure_loop()
        assert self._wake is not None
        trace = EngineRequestTrace(
            tracer=self._tracer, identity=self.identity,
            request_id=request_id or f"cmpl-{uuid.uuid4().hex}",
            prompt_tokens=len(prompt_ids), max_tokens=max_tokens, trace_headers=trace_headers,
        )
        state = _RequestState(trace=trace, tokens=asyncio.Queue(),
                              kv_received_tokens=max(0, remote_kv_tokens))
        seq = Sequence(f"{self.config.replica}-{next(self._ids)}", list(prompt_ids),
                       max(1, max_tokens), payload=state, remote_tokens=max(0, remote_kv_tokens))
        if kv_arrives_in > 0:
            await asyncio.sleep(kv_arrives_in)
        self.scheduler.add(seq)
        self._wake.set()
        try:
            while True:
                token = await state.tokens.get()
                if token is None:
                    return
                yield token
        finally:
            if not state.done:  # the consumer went away: abort and report it
                state.done = True
                self.scheduler.abort(seq)
                self._finish(seq, state, finish_reason="abort", error=True)

    async def shutdown(self) -> None:
        """Stop the step loop; idempotent. Pending requests are aborted."""
        self._closed = True
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._loop_task
            self._loop_task = None
        if self._kv_events is not None:
            self._kv_events.close()
            self._kv_events = None
        for seq in list(self.scheduler.waiting) + list(self.scheduler.running):
            state = seq.payload
            if isinstance(state, _RequestState) and not state.done:
                state.done = True
                self.scheduler.abort(seq)
                self._finish(seq, state, finish_reason="abort", error=True)
                state.tokens.put_nowait(None)

    # --- the step loop -----------------------------------------------------------------
    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._wake = asyncio.Event()
            # in a context of its own: started by a request, it serves every request, and
            # would otherwise keep that request's context (its span) as long as it runs
            self._loop_task = contextvars.Context().run(
                asyncio.get_running_loop().create_task, self._run())

    async def _run(self) -> None:
        assert self._wake is not None
        while not self._closed:
            if not self.scheduler.has_work:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                await self._step()
                if self._kv_events is not None:
                    self._kv_events.publish(self.kv.drain_events())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep serving; count it like telemetry
                telemetry_errors.count("reference.engine.step", exc)
                await asyncio.sleep(0.001)

    async def _step(self) -> None:
        plan = self.scheduler.schedule()
        now = time.time()
        for seq in plan.newly_admitted:
            self._admitted(seq, now)
        for seq in plan.out_of_blocks:
            self._complete(seq, "length")
        if plan.empty:  # blocks are held by nothing runnable: wait for frees
            await asyncio.sleep(self.roofline.step_overhead_seconds * self.config.time_scale)
            return
        works = self._work(plan)
        total_flops = sum(f for f, _, _ in works)
        total_bytes = sum(b for _, b, _ in works)
        modeled = self.roofline.step_seconds(total_flops, total_bytes, plan.tokens)
        dispatch = self.roofline.step_overhead_seconds * self.config.time_scale
        started = time.perf_counter()
        await asyncio.sleep(modeled * self.config.time_scale)
        wall = time.perf_counter() - started
        self.steps += 1
        self.busy_seconds += wall
        batch = plan.batch_size
        weights = [self.roofline.sequence_work(f, b, batch) for f, b, _ in works]
        total_weight = sum(weights) or 1.0
        participants = [c.seq for c in plan.prefills] + plan.decodes
        for seq, weight, (_, _, phase) in zip(participants, weights, works, strict=True):
            state = seq.payload
            assert isinstance(state, _RequestState)
            state.gpu_seconds += wall * weight / total_weight
            state.trace.step(phase, wall, dispatch)
        before = {seq.seq_id: len(seq.output_ids) for seq in participants}
        finished = self.scheduler.complete_step(plan, _next_token)
        now = time.time()
        for seq in participants:
            state = seq.payload
            assert isinstance(state, _RequestState)
            produced = seq.output_ids[before[seq.seq_id]:]
            if produced:
                state.trace.first_token(now)
            for token in produced:
                state.emitted += 1
                state.tokens.put_nowait(token)
        for seq in finished:
            self._complete(seq, "length")

    def _complete(self, seq: Sequence, finish_reason: str) -> None:
        state = seq.payload
        assert isinstance(state, _RequestState)
        state.done = True
        self._finish(seq, state, finish_reason=finish_reason)
        state.tokens.put_nowait(None)

    def _admitted(self, seq: Sequence, now: float) -> None:
        state = seq.payload
        assert isinstance(state, _RequestState)
        state.trace.scheduled(now)
        if seq.preemptions:
            state.trace.preempted()
            return
        started = time.perf_counter()
        fingerprints = prefix_fingerprints(seq.prompt_ids, self.config.fingerprints)
        fingerprint_seconds = time.perf_counter() - started
        state.trace.kv_lookup(seq.lookup_seconds + fingerprint_seconds, seq.cached_tokens,
                              fingerprints, self.config.fingerprints.block_tokens)

    def _work(self, plan: StepPlan) -> list[tuple[float, float, Phase]]:
        """(FLOPs, own bytes, phase) of each participant: prefills first, then decodes."""
        out: list[tuple[float, float, Phase]] = []
        for chunk in plan.prefills:
            out.append((self.roofline.prefill_flops(chunk.new_tokens, chunk.context_before),
                        self.roofline.prefill_bytes(chunk.new_tokens, chunk.context_before),
                        Phase.PREFILL))
        for seq in plan.decodes:
            context = seq.context_len
            out.append((self.roofline.decode_flops(context), self.roofline.decode_bytes(context),
                        Phase.DECODE))
        return out

    def _finish(self, seq: Sequence, state: _RequestState, finish_reason: str,
                error: bool = False) -> None:
        self.finished_requests += 1
        trace_id = state.trace.finish(time.time(), state.emitted, finish_reason, error)
        if self._ground_truth is not None and trace_id and not error:
            try:
                kv_tokens = state.kv_received_tokens
                self._ground_truth.write(
                    trace_id, state.gpu_seconds, state.gpu_seconds * self.gpu_dollars_per_second,
                    engine=self.config.replica, node=self.config.node,
                    kv_transfer_tokens=kv_tokens if kv_tokens else None,
                    kv_transfer_bytes=(round(kv_tokens * self.roofline.model.kv_bytes_per_token)
                                       if kv_tokens else None))
            except Exception as exc:
                telemetry_errors.count("reference.ground_truth", exc)


def _next_token(seq: Sequence) -> int:
    """A deterministic stand-in for sampling."""
    return (len(seq.output_ids) * 7919 + seq.prompt_len * 31 + 17) % TOY_VOCAB_SIZE
