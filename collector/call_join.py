"""Joins one LLM call that reached the collector as two traces, by its response id.

A client or proxy that does not forward ``traceparent`` starts a trace of its own for
the call: the openai client under opentelemetry-instrumentation-openai-v2 (its httpx2
transport is not instrumented), OpenLLMetry's ``openai.chat`` spans, LiteLLM's proxy
(``forward_traceparent_to_llm_provider`` is off by default). Its spans and the serving
side's (gateway, engine) then arrive as two traces, and the mapper makes two records of
one call: the count and the tokens doubled.

Both sides name the response: the client span's and LiteLLM's ``gen_ai.response.id`` is
the gateway's response id and vLLM's ``gen_ai.request.id``. This component, between the
stage mapper and the attributor, holds the *outer* record (a client or proxy hop with no
engine under it, ``RequestRecord.outer_hop``) until its *inner* record (the serving side)
arrives, and hands on one record: the inner one, priced as before, with the outer hop's
stages and the user's view of it (rules in :func:`merge_outer`).

Inner records pass at once until an outer record has been seen (``mode: auto``): from then
on, for ``active_seconds``, each inner record with a response id waits up to
``wait_seconds`` for its outer one, so that the merged record is what gets priced. An outer
record that arrives after its inner record was handed on is not a second request: it is
counted (``late``) and dropped, so counts and tokens stay exact; only its
client-side detail is lost. An outer record whose inner never comes (a call to a provider
outside the cluster) goes on alone after ``wait_seconds``; should its serving half still
come later (more than ``wait_seconds`` apart, or before auto mode held it), the call is
counted twice and ``serving_after_alone`` says how often. Several outer hops of one call
(a client, then the proxy it called) all join the serving record, proxies first.

Records forwarded by other replicas are not joined here (docs/architecture.md).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from tokenpath import metric_names as M
from tokenpath.collector.stats import CollectorStats
from tokenpath.config import ConfigError
from tokenpath.pipeline import IdleCost, RecordSink
from tokenpath.records import RequestRecord, StageTiming
from tokenpath.stages import CLIENT_DECODE, CLIENT_TOKENIZE, DERIVED, StageId

DEFAULT_WAIT_SECONDS = 10.0  # two OTLP batch delays (5 s each by default) apart
DEFAULT_ACTIVE_SECONDS = 600.0
DEFAULT_MAX_HELD = 50_000
JOIN_MODES = ("auto", "always", "off")
# Outcomes counted in collector_calls_joined_total{outcome}
JOINED = "joined"
LATE = "late"
ALONE = "alone"
SERVING_AFTER_ALONE = "serving_after_alone"  # counted twice: the halves came too far apart
HOP_CLIENT = "client"
HOP_PROXY = "proxy"
_MIN_TICK_SECONDS = 0.25
# How long the keys of a handed-on inner record are remembered (a late outer record may
# come a whole wait after the inner one's own wait)
_PASSED_MEMORY_FACTOR = 3.0
_MIN_PASSED_MEMORY_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class JoinConfig:
    """``join`` section: ``mode`` auto (hold inner records only once an outer one has been
    seen), always, or off; ``wait_seconds`` the longest a record waits for its other half;
    ``active_seconds`` how long auto mode stays on after the last outer record;
    ``max_held`` records held at most (the oldest goes on when full)."""

    mode: str = "auto"
    wait_seconds: float = DEFAULT_WAIT_SECONDS
    active_seconds: float = DEFAULT_ACTIVE_SECONDS
    max_held: int = DEFAULT_MAX_HELD

    def validate(self) -> None:
        if self.mode not in JOIN_MODES:
            raise ConfigError("join.mode", f"must be one of {', '.join(JOIN_MODES)}")
        if not self.wait_seconds >= 0:
            raise ConfigError("join.wait_seconds", "must be >= 0")
        if not self.active_seconds >= 0:
            raise ConfigError("join.active_seconds", "must be >= 0")
        if self.max_held < 1:
            raise ConfigError("join.max_held", "must be >= 1")


def join_keys(record: RequestRecord) -> set[str]:
    """The ids that name the call's response: the gateway's or client's response id and,
    on the serving side, the engine's request id (vLLM's is the response id)."""
    keys = {record.response_id} if record.response_id else set()
    if record.outer_hop is None and record.request_id:
        keys.add(record.request_id)
    return keys


def add_client_gaps(stages: dict[StageId, StageTiming], client_start: float,
                    client_end: float, serving_start: float, serving_end: float) -> None:
    """The client stages of a GenAI client span around the serving side, derived from the
    gaps (unix seconds): client_tokenize from the client's start to the serving side's,
    client_decode from the serving side's end to the client's. Both hold the wire time
    too; across hosts they hold the clocks' skew, and a negative gap is 0. A stage the
    record already has (a client shim measured it) is kept."""
    for stage, seconds in ((CLIENT_TOKENIZE, serving_start - client_start),
                           (CLIENT_DECODE, client_end - serving_end)):
        if stage not in stages:
            stages[stage] = StageTiming(stage, max(0.0, seconds), DERIVED)


def merge_outer(inner: RequestRecord, outer: RequestRecord) -> RequestRecord:
    """The inner record, with the outer hop added (in place; returned).

    - Tokens, model, engine and pricing fields stay the inner record's (engine > gateway
      > client, as within a trace).
    - A proxy hop's stages (LiteLLM's auth, router and its own gateway time) are a hop in
      series with the inner gateway's: they add to the same stages.
    - A client hop (a GenAI client span with nothing under it) gives the client stages
      the inner record lacks, derived from the gaps between its client span and the
      serving side (:func:`add_client_gaps`); an app's server span around the client adds
      no stage.
    - TTFT is the user's: the outer record's when it measured one, else the inner one's
      plus the time before the serving side began.
    - Start and end span both; the outer trace id is kept in ``joined_trace_ids``.
    """
    client = outer.outer_hop == HOP_CLIENT
    start = (outer.client_start_unix if client and outer.client_start_unix is not None
             else outer.start_unix)
    end = (outer.client_end_unix if client and outer.client_end_unix is not None
           else outer.end_unix)
    lead = max(0.0, inner.start_unix - start)
    if client:  # an app's own spans around its client call are not the call's stages
        add_client_gaps(inner.stages, start, end, inner.start_unix, inner.end_unix)
    else:
        for stage, timing in outer.stages.items():
            mine = inner.stages.get(stage)
            if mine is None:
                inner.stages[stage] = timing
            else:
                mine.seconds += timing.seconds
    if outer.ttft_seconds is not None:
        inner.ttft_seconds = outer.ttft_seconds
    elif inner.ttft_seconds is not None:
        inner.ttft_seconds += lead
    inner.start_unix = min(inner.start_unix, start)
    inner.end_unix = max(inner.end_unix, end)
    inner.span_count += outer.span_count
    inner.complete = inner.complete and outer.complete
    if inner.status == "ok" and outer.status != "ok":
        inner.status = outer.status
    if inner.model == M.UNKNOWN:
        inner.model = outer.model
    if outer.trace_id != inner.trace_id:
        inner.joined_trace_ids = (*inner.joined_trace_ids, outer.trace_id)
    return inner


@dataclass(slots=True)
class _Held:
    record: RequestRecord
    keys: set[str]
    deadline: float


class CallJoiner:
    """RecordSink between the mapper and the attributor (or the forwarder)."""

    def __init__(self, downstream: RecordSink, config: JoinConfig | None = None,
                 stats: CollectorStats | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config or JoinConfig()
        self._config.validate()
        self._downstream = downstream
        self._stats = stats or CollectorStats()
        self._clock = clock
        self._held: OrderedDict[int, _Held] = OrderedDict()  # by id(record), oldest first
        # (is outer, key) -> held records: one inner, or the outer hops of one call (a
        # client and the proxy it called)
        self._by_key: dict[tuple[bool, str], list[int]] = {}
        # keys of inner records already handed on, to recognise a late outer record
        self._passed: OrderedDict[str, float] = OrderedDict()
        # keys of outer records that went on alone: a serving half after them is counted
        self._alone: OrderedDict[str, float] = OrderedDict()
        self._active_until = float("inf") if self._config.mode == "always" else float("-inf")
        self._closed = False

    @property
    def tick_seconds(self) -> float:
        return max(_MIN_TICK_SECONDS, self._config.wait_seconds / 4)

    @property
    def held(self) -> int:
        return len(self._held)

    def consume_record(self, record: RequestRecord) -> None:
        if self._config.mode == "off" or self._closed:
            self._downstream.consume_record(record)
            return
        now = self._clock()
        self._expire(now)
        keys = join_keys(record)
        if not keys:
            self._downstream.consume_record(record)
            return
        outer = record.outer_hop is not None
        if outer and self._config.mode == "auto":
            self._active_until = now + self._config.active_seconds
        if outer:
            inner_ident = next((self._by_key[(False, k)][0] for k in keys
                                if (False, k) in self._by_key), None)
            if inner_ident is not None:  # the serving half waits for it
                inner = self._release(inner_ident)
                self._pass(self._merge_all(inner, [record]), join_keys(inner), now)
                return
            if any(k in self._passed for k in keys):
                self._stats.calls_joined.inc(LATE)  # its inner was counted
                return
        else:
            if any((True, k) in self._by_key for k in keys):
                self._pass(self._merge_all(record, []), keys, now)
                return
            if any(k in self._alone for k in keys):
                # its outer half went on alone (it came over join.wait_seconds apart):
                # this call is counted twice; say so
                self._stats.calls_joined.inc(SERVING_AFTER_ALONE)
        if not outer and now >= self._active_until:
            self._pass(record, keys, now)
            return
        self._hold(record, keys, now + self._config.wait_seconds)

    def consume_idle_cost(self, idle: IdleCost) -> None:
        self._downstream.consume_idle_cost(idle)

    def tick(self) -> None:
        self._expire(self._clock())

    def shutdown(self) -> None:
        """Hand on every held record, then shut downstream. Idempotent."""
        if self._closed:
            return
        self._closed = True
        while self._held:
            self._timeout(next(iter(self._held)))
        self._downstream.shutdown()

    # --- internals -----------------------------------------------------------------------

    def _merge_all(self, inner: RequestRecord, arrived: list[RequestRecord]) -> RequestRecord:
        """``inner`` with every outer hop of its call merged in: those just ``arrived`` and
        those held under its keys; proxies first, then the client."""
        idents = [i for k in join_keys(inner) for i in self._by_key.get((True, k), ())]
        outers = [*arrived, *(self._release(i) for i in dict.fromkeys(idents))]
        outers.sort(key=lambda r: r.outer_hop != HOP_PROXY)
        for outer in outers:
            self._stats.calls_joined.inc(JOINED)
            inner = merge_outer(inner, outer)
        return inner

    def _hold(self, record: RequestRecord, keys: set[str], deadline: float) -> None:
        if len(self._held) >= self._config.max_held:
            self._timeout(next(iter(self._held)))
        ident = id(record)
        self._held[ident] = _Held(record, keys, deadline)
        outer = record.outer_hop is not None
        for key in keys:
            self._by_key.setdefault((outer, key), []).append(ident)

    def _release(self, ident: int) -> RequestRecord:
        held = self._held.pop(ident)
        outer = held.record.outer_hop is not None
        for key in held.keys:
            idents = self._by_key.get((outer, key))
            if idents is not None and ident in idents:
                idents.remove(ident)
                if not idents:
                    del self._by_key[(outer, key)]
        return held.record

    def _timeout(self, ident: int) -> None:
        record = self._release(ident)
        now = self._clock()
        if record.outer_hop is not None:
            self._stats.calls_joined.inc(ALONE)
            for key in join_keys(record):
                self._alone[key] = now
                self._alone.move_to_end(key)
        self._pass(record, join_keys(record), now)

    def _pass(self, record: RequestRecord, keys: set[str], now: float) -> None:
        if record.outer_hop is None:
            for key in keys:
                self._passed[key] = now
                self._passed.move_to_end(key)
        self._downstream.consume_record(record)

    def _expire(self, now: float) -> None:
        while self._held:
            ident, held = next(iter(self._held.items()))
            if held.deadline > now:
                break
            self._timeout(ident)
        horizon = now - max(_MIN_PASSED_MEMORY_SECONDS,
                            _PASSED_MEMORY_FACTOR * self._config.wait_seconds)
        for memory in (self._passed, self._alone):
            while memory:
                key, seen = next(iter(memory.items()))
                if seen > horizon and len(memory) <= self._config.max_held:
                    break
                del memory[key]
