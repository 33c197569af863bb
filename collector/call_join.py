"""Joins one LLM call that reached the collector as two traces, by its response id, or,
where the outer half names none, by what both halves know.

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

An outer record with no response id (OpenInference's spans carry none) is joined by what
both halves know instead (:func:`fits`): the same input and output token counts, the
client's interval holding the serving record's within ``clock_skew_seconds``, and the same
model where both name one. It joins the one serving record that fits, held or arriving
within its wait; where two or more fit (identical calls at the same time), it joins none:
the serving records go on as they are, the outer record is dropped (never a double count)
and counted ``ambiguous``. A fit among serving records already handed on is ``late``.

Records forwarded by other replicas are not joined here (docs/architecture.md).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from tokenpath import metric_names as M
from tokenpath.collector.interfaces import RecordSink
from tokenpath.collector.stats import CollectorStats
from tokenpath.config import check, validate_fields
from tokenpath.records import IdleCost, RequestRecord, StageTiming
from tokenpath.slo import SloConfig, judge_record
from tokenpath.stage_members import CLIENT_DECODE, CLIENT_TOKENIZE, DERIVED
from tokenpath.stages import StageId

DEFAULT_WAIT_SECONDS = 10.0  # two OTLP batch delays (5 s each by default) apart
DEFAULT_ACTIVE_SECONDS = 600.0
DEFAULT_MAX_HELD = 50_000
# How far the two halves' clocks may disagree when the client's interval must hold the
# serving side's (a join without a response id): well above NTP-synchronised hosts' skew,
# below the gap between two short calls one after the other.
DEFAULT_CLOCK_SKEW_SECONDS = 0.25
JOIN_MODES = ("auto", "always", "off")
# Outcomes counted in collector_calls_joined_total{outcome}
JOINED = "joined"
LATE = "late"
ALONE = "alone"
SERVING_AFTER_ALONE = "serving_after_alone"  # counted twice: the halves came too far apart
AMBIGUOUS = "ambiguous"  # no response id, and more than one serving record fits: joined none
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
    ``max_held`` records held at most (the oldest goes on when full);
    ``clock_skew_seconds`` the tolerance of the interval test of a join without a response
    id (:func:`fits`)."""

    mode: str = field(default="auto", metadata=check(one_of=JOIN_MODES))
    wait_seconds: float = field(default=DEFAULT_WAIT_SECONDS, metadata=check(ge=0))
    active_seconds: float = field(default=DEFAULT_ACTIVE_SECONDS, metadata=check(ge=0))
    max_held: int = field(default=DEFAULT_MAX_HELD, metadata=check(ge=1))
    clock_skew_seconds: float = field(default=DEFAULT_CLOCK_SKEW_SECONDS, metadata=check(ge=0))

    def validate(self) -> None:
        validate_fields(self, "join")


def join_keys(record: RequestRecord) -> set[str]:
    """The ids that name the call's response: the gateway's or client's response id and,
    on the serving side, the engine's request id (vLLM's is the response id)."""
    keys = {record.response_id} if record.response_id else set()
    if record.outer_hop is None and record.request_id:
        keys.add(record.request_id)
    return keys


@dataclass(slots=True)
class CallPrint:
    """What both halves of a call know without a response id: its token counts, its
    interval (unix seconds; an outer client hop's is its client span's) and its model."""

    input_tokens: int
    output_tokens: int
    start: float
    end: float
    model: str
    joined: bool = False  # a serving record's print that an outer record already joined


def call_print(record: RequestRecord) -> CallPrint | None:
    """The record's print, or None when it has no tokens to match on: an outer record with
    a response id joins by that alone, and so does a serving record it names."""
    if record.input_tokens <= 0 and record.output_tokens <= 0:
        return None
    start, end = record.start_unix, record.end_unix
    if record.outer_hop is not None:
        if record.response_id:
            return None
        if record.outer_hop == HOP_CLIENT:
            if record.client_start_unix is not None:
                start = record.client_start_unix
            if record.client_end_unix is not None:
                end = record.client_end_unix
    return CallPrint(record.input_tokens, record.output_tokens, start, end, record.model)


def fits(outer: CallPrint, inner: CallPrint, skew: float) -> bool:
    """Whether serving print ``inner`` can be the call that outer print ``outer`` wraps:
    equal token counts, the outer interval holding the inner one within ``skew`` seconds
    at each end, and the same model where both name one."""
    return (outer.input_tokens == inner.input_tokens
            and outer.output_tokens == inner.output_tokens
            and inner.start >= outer.start - skew and inner.end <= outer.end + skew
            and (outer.model == inner.model or outer.model == M.UNKNOWN
                 or inner.model == M.UNKNOWN))


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
    if inner.cache_read_source is None and outer.cache_read_source is not None:
        inner.cache_read_tokens = min(inner.input_tokens, outer.cache_read_tokens)
        inner.cache_read_source = outer.cache_read_source
    if outer.trace_id != inner.trace_id:
        inner.joined_trace_ids = (*inner.joined_trace_ids, outer.trace_id)
    return inner


@dataclass(slots=True)
class _Held:
    record: RequestRecord
    keys: set[str]
    deadline: float
    fingerprint: CallPrint | None = None  # set when it can join without a response id


def _tokens_of(fingerprint: CallPrint) -> tuple[int, int]:
    return fingerprint.input_tokens, fingerprint.output_tokens


class _PrintMemory:
    """Prints of records handed on, by token counts, oldest first; forgotten like the key
    memories (a horizon, at most ``max_held``)."""

    def __init__(self) -> None:
        self._order: OrderedDict[int, tuple[float, CallPrint]] = OrderedDict()
        self._by_tokens: dict[tuple[int, int], list[int]] = {}
        self._serial = 0

    def add(self, fingerprint: CallPrint, now: float) -> None:
        self._serial += 1
        self._order[self._serial] = (now, fingerprint)
        self._by_tokens.setdefault(_tokens_of(fingerprint), []).append(self._serial)

    def with_tokens(self, tokens: tuple[int, int]) -> list[CallPrint]:
        return [self._order[serial][1] for serial in self._by_tokens.get(tokens, ())]

    def expire(self, horizon: float, limit: int) -> None:
        while self._order:
            serial, (seen, fingerprint) = next(iter(self._order.items()))
            if seen > horizon and len(self._order) <= limit:
                break
            del self._order[serial]
            tokens = _tokens_of(fingerprint)
            serials = self._by_tokens[tokens]
            serials.remove(serial)
            if not serials:
                del self._by_tokens[tokens]


class CallJoiner:
    """RecordSink between the mapper and the attributor (or the forwarder)."""

    def __init__(self, downstream: RecordSink, config: JoinConfig | None = None,
                 stats: CollectorStats | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 slo: SloConfig | None = None) -> None:
        """``slo``: the classes the mapper classified by; a joined record (its TTFT and
        duration now the outer hop's) is judged again against its class."""
        self._slo = slo
        self._config = config or JoinConfig()
        self._config.validate()
        self._downstream = downstream
        self._stats = stats or CollectorStats()
        self._clock = clock
        self._held: OrderedDict[int, _Held] = OrderedDict()  # by id(record), oldest first
        # (is outer, key) -> held records: one inner, or the outer hops of one call (a
        # client and the proxy it called)
        self._by_key: dict[tuple[bool, str], list[int]] = {}
        # (is outer, token counts) -> held records with a print: the serving records, and
        # the outer records that carry no response id
        self._by_tokens: dict[tuple[bool, tuple[int, int]], list[int]] = {}
        # keys of inner records already handed on, to recognise a late outer record
        self._passed: OrderedDict[str, float] = OrderedDict()
        # keys of outer records that went on alone: a serving half after them is counted
        self._alone: OrderedDict[str, float] = OrderedDict()
        # the same two memories for the joins without a response id
        self._passed_prints = _PrintMemory()
        self._alone_prints = _PrintMemory()
        self._active_until = float("inf") if self._config.mode == "always" else float("-inf")
        self._closed = False

    @property
    def tick_seconds(self) -> float:
        return max(_MIN_TICK_SECONDS, self._config.wait_seconds / 4)

    @property
    def held(self) -> int:
        return len(self._held)

    def earliest_held_start(self) -> float:
        """The earliest engine start (else start) among the records held (pipeline
        thread): what a forwarding replica may still hand on (inf: none)."""
        earliest = math.inf
        for held in self._held.values():
            record = held.record
            start = record.prefill_start_unix
            if start is None:
                start = record.start_unix
            if start < earliest:
                earliest = start
        return earliest

    def consume_record(self, record: RequestRecord) -> None:
        if self._config.mode == "off" or self._closed:
            self._downstream.consume_record(record)
            return
        now = self._clock()
        self._expire(now)
        keys = join_keys(record)
        fingerprint = call_print(record)
        if not keys and fingerprint is None:
            self._downstream.consume_record(record)
            return
        outer = record.outer_hop is not None
        if outer and self._config.mode == "auto":
            self._active_until = now + self._config.active_seconds
        if outer and keys:
            inner_ident = next((self._by_key[(False, k)][0] for k in keys
                                if (False, k) in self._by_key), None)
            if inner_ident is not None:  # the serving half waits for it
                held = self._release(inner_ident)
                self._pass(self._merge_all(held.record, [record]), held.keys, now,
                           held.fingerprint)
                return
            if any(k in self._passed for k in keys):
                self._stats.calls_joined.inc(LATE)  # its inner was counted
                return
        elif outer and fingerprint is not None:
            if self._outer_by_print(record, fingerprint, now):
                return
        elif not outer:
            if any((True, k) in self._by_key for k in keys):
                self._pass(self._merge_all(record, []), keys, now, fingerprint)
                return
            if fingerprint is not None and self._serving_by_print(record, keys, fingerprint,
                                                                  now):
                return
            if any(k in self._alone for k in keys) or (
                    fingerprint is not None and self._fits_alone(fingerprint)):
                # its outer half went on alone (it came over join.wait_seconds apart):
                # this call is counted twice; say so
                self._stats.calls_joined.inc(SERVING_AFTER_ALONE)
        if not outer and now >= self._active_until:
            self._pass(record, keys, now, fingerprint)
            return
        self._hold(record, keys, now + self._config.wait_seconds, fingerprint)

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

    def _outer_by_print(self, record: RequestRecord, fingerprint: CallPrint,
                        now: float) -> bool:
        """An outer record with no response id: joins the one serving record that fits
        it, held or (``late``) already handed on; joins none where several fit
        (``ambiguous``: it is dropped, they go on as they are). True when it was dealt
        with; False: nothing fits yet, it waits."""
        skew = self._config.clock_skew_seconds
        tokens = _tokens_of(fingerprint)
        held: list[int] = []
        for ident in self._by_tokens.get((False, tokens), ()):
            inner = self._held[ident].fingerprint
            if inner is not None and fits(fingerprint, inner, skew):
                held.append(ident)
        passed = [p for p in self._passed_prints.with_tokens(tokens)
                  if not p.joined and fits(fingerprint, p, skew)]
        if len(held) + len(passed) > 1:
            self._stats.calls_joined.inc(AMBIGUOUS)
            return True
        if held:
            inner_held = self._release(held[0])
            self._pass(self._merge_all(inner_held.record, [record]), inner_held.keys, now,
                       inner_held.fingerprint, by_print=True)
            return True
        if passed:
            passed[0].joined = True
            self._stats.calls_joined.inc(LATE)  # its serving record was counted
            return True
        return False

    def _serving_by_print(self, record: RequestRecord, keys: set[str],
                          fingerprint: CallPrint, now: float) -> bool:
        """A serving record: joins the one held outer record without a response id that
        it fits; where several fit, joins none and drops them (``ambiguous``). True when it
        was handed on joined."""
        skew = self._config.clock_skew_seconds
        idents: list[int] = []
        for ident in self._by_tokens.get((True, _tokens_of(fingerprint)), ()):
            outer = self._held[ident].fingerprint
            if outer is not None and fits(outer, fingerprint, skew):
                idents.append(ident)
        if not idents:
            return False
        if len(idents) > 1:
            for ident in idents:
                self._release(ident)
                self._stats.calls_joined.inc(AMBIGUOUS)
            return False
        outer_record = self._release(idents[0]).record
        self._pass(self._merge_all(record, [outer_record]), keys, now, fingerprint,
                   by_print=True)
        return True

    def _fits_alone(self, fingerprint: CallPrint) -> bool:
        skew = self._config.clock_skew_seconds
        return any(fits(alone, fingerprint, skew)
                   for alone in self._alone_prints.with_tokens(_tokens_of(fingerprint)))

    def _merge_all(self, inner: RequestRecord, arrived: list[RequestRecord]) -> RequestRecord:
        """``inner`` with every outer hop of its call merged in: those just ``arrived`` and
        those held under its keys; proxies first, then the client."""
        idents = [i for k in join_keys(inner) for i in self._by_key.get((True, k), ())]
        outers = [*arrived, *(self._release(i).record for i in dict.fromkeys(idents))]
        outers.sort(key=lambda r: r.outer_hop != HOP_PROXY)
        for outer in outers:
            self._stats.calls_joined.inc(JOINED)
            inner = merge_outer(inner, outer)
        if outers and self._slo is not None and inner.slo is not None:
            judge_record(inner, self._slo)
        return inner

    def _hold(self, record: RequestRecord, keys: set[str], deadline: float,
              fingerprint: CallPrint | None) -> None:
        if len(self._held) >= self._config.max_held:
            self._timeout(next(iter(self._held)))
        ident = id(record)
        self._held[ident] = _Held(record, keys, deadline, fingerprint)
        outer = record.outer_hop is not None
        for key in keys:
            self._by_key.setdefault((outer, key), []).append(ident)
        if fingerprint is not None:
            self._by_tokens.setdefault((outer, _tokens_of(fingerprint)), []).append(ident)

    def _release(self, ident: int) -> _Held:
        held = self._held.pop(ident)
        outer = held.record.outer_hop is not None
        for key in held.keys:
            idents = self._by_key.get((outer, key))
            if idents is not None and ident in idents:
                idents.remove(ident)
                if not idents:
                    del self._by_key[(outer, key)]
        if held.fingerprint is not None:
            index = (outer, _tokens_of(held.fingerprint))
            idents = self._by_tokens.get(index)
            if idents is not None and ident in idents:
                idents.remove(ident)
                if not idents:
                    del self._by_tokens[index]
        return held

    def _timeout(self, ident: int) -> None:
        held = self._release(ident)
        record = held.record
        now = self._clock()
        if record.outer_hop is not None:
            self._stats.calls_joined.inc(ALONE)
            for key in held.keys:
                self._alone[key] = now
                self._alone.move_to_end(key)
            if held.fingerprint is not None and not held.keys:
                self._alone_prints.add(held.fingerprint, now)
        self._pass(record, held.keys, now, held.fingerprint)

    def _pass(self, record: RequestRecord, keys: set[str], now: float,
              fingerprint: CallPrint | None, by_print: bool = False) -> None:
        """Hands ``record`` on; a serving record's keys and print (as it came, before any
        join; ``by_print``: an outer record without a response id joined it) are kept to
        recognise a late outer record."""
        if record.outer_hop is None:
            for key in keys:
                self._passed[key] = now
                self._passed.move_to_end(key)
            if fingerprint is not None:
                fingerprint.joined = by_print
                self._passed_prints.add(fingerprint, now)
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
        self._passed_prints.expire(horizon, self._config.max_held)
        self._alone_prints.expire(horizon, self._config.max_held)
