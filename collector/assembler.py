"""Joins spans into requests: one trace id, one request.

Rules (documented in docs/architecture.md, "Late, duplicate and out-of-order spans"):

- Spans of a trace may arrive in any order and in any number of export batches.
- A trace is final ``root_grace_seconds`` after its root span (no parent) arrived, or a
  local root (a server span whose parent is in another process, by the OTLP span flags:
  a client that propagates but exports elsewhere), or after
  ``idle_timeout_seconds`` with no new span; without a root it is final as ``complete:
  false``.
- The same span (trace id + span id) delivered twice counts once (``duplicate``).
- A span for a trace that was already finalized is dropped and counted (``late``): records
  are never rewritten, so there are no duplicate records.
- A trace without a root that goes idle while it holds no LLM call span yet (a long
  stream's early stage span) gets one more idle period before it is emitted alone.
- A trace without a root that goes idle is emitted with what it holds, but stays open: an
  agent's later LLM calls (after a long tool step) arrive as a continuation of the trace,
  emitted in their turn (``AssembledTrace.continued``) as their own call records. A span
  already emitted that arrives again is a duplicate. A call span above what was emitted
  (the parent an emitted span named, or its parent in turn: a gateway's server span
  exported after the engine's part went out) is the call already recorded: it is late,
  never a second request (a root among them finishes the trace). A client's or proxy's
  hop (``calls.is_outer_hop_span``) goes on for the call joiner to join, and spans of no
  call (a tool step, the workflow's root) go on as before. Once the root has been
  emitted the trace is finished and later spans are late.
- Over ``max_traces`` in flight, the least recently updated trace is finalized early as
  incomplete (``capacity``); over ``max_spans_per_trace``, extra spans are dropped, but an
  important span (root, server, client, engine, stage or gen_ai) replaces an expendable
  one, so the cap never drops the span a record is built from.
- The ASGI instrumentation's per-message sub-spans (``asgi.event.type``: one per streamed
  chunk) are folded into a count and the first body send per server span, never kept: a
  1,500-chunk stream is one server span, not 1,506 spans against the cap.
- Finalization runs on the collector's own monotonic clock (arrival time), never on span
  timestamps, so hosts whose clocks disagree cannot hold a trace open or close it early.
  Stage times come from one span's own start and end (one host's clock) or from measured
  seconds, and are clamped at zero: clock skew between hosts never yields a negative time.
- Spans named ``tokenpath.request_annotation`` are not requests: they are indexed by
  ``gen_ai.request.id`` for a bounded time and joined into the trace carrying that id.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tokenpath.attributes import (
    GEN_AI_REQUEST_ID,
    SPAN_REQUEST_ANNOTATION,
    STAGE,
    VLLM_REQUEST_SPAN_NAME,
)
from tokenpath.collector.calls import is_call_span, is_outer_hop_span
from tokenpath.collector.interfaces import TraceConsumer
from tokenpath.collector.spans import SPAN_KIND_CLIENT, SPAN_KIND_SERVER, Attributes, SpanData
from tokenpath.collector.stats import PIPELINE_STEP_HAND_OFF, CollectorStats
from tokenpath.config import check, validate_fields

log = logging.getLogger(__name__)

DEFAULT_MAX_TRACES = 20_000
DEFAULT_MAX_SPANS_PER_TRACE = 1_000
# Above the OpenTelemetry SDK's default batch delay (OTEL_BSP_SCHEDULE_DELAY, 5 s): a
# child span exported by another process may arrive that long after the root.
DEFAULT_ROOT_GRACE_SECONDS = 6.0
DEFAULT_IDLE_TIMEOUT_SECONDS = 30.0
DEFAULT_FINISHED_MEMORY = 100_000
# Traces handed on but open for later calls (no root without a parent seen yet), and the
# span ids kept of each to tell a re-sent span, or one above those emitted, from a new one.
DEFAULT_OPEN_MEMORY = 20_000
MAX_OPEN_SPAN_IDS = 64
DEFAULT_ANNOTATION_TTL_SECONDS = 120.0
DEFAULT_MAX_ANNOTATIONS = 100_000
# The shortest wait between two finalization passes: under load, traces falling due
# within one tick are finalized together. An idle assembler does not tick at all.
DEFAULT_TICK_SECONDS = 0.1
# The longest single sleep of the finalization thread (threading's waits overflow past
# about 9e9 s, which a configured timeout of .inf would ask for).
MAX_SLEEP_SECONDS = 3600.0


@dataclass(frozen=True, slots=True)
class AssemblerConfig:
    max_traces: int = field(default=DEFAULT_MAX_TRACES, metadata=check(ge=1))
    max_spans_per_trace: int = field(default=DEFAULT_MAX_SPANS_PER_TRACE, metadata=check(ge=1))
    root_grace_seconds: float = field(default=DEFAULT_ROOT_GRACE_SECONDS, metadata=check(ge=0))
    idle_timeout_seconds: float = field(default=DEFAULT_IDLE_TIMEOUT_SECONDS,
                                        metadata=check(ge=0))
    finished_memory: int = field(default=DEFAULT_FINISHED_MEMORY, metadata=check(ge=1))
    open_memory: int = field(default=DEFAULT_OPEN_MEMORY, metadata=check(ge=1))
    annotation_ttl_seconds: float = field(default=DEFAULT_ANNOTATION_TTL_SECONDS,
                                          metadata=check(ge=0))
    max_annotations: int = field(default=DEFAULT_MAX_ANNOTATIONS, metadata=check(ge=1))
    tick_seconds: float = field(default=DEFAULT_TICK_SECONDS, metadata=check(gt=0))

    def validate(self) -> None:
        validate_fields(self, "assembler")


@dataclass(slots=True, init=False)  # a written __init__: see tokenpath/records.py
class AssembledTrace:
    """The spans of one trace handed downstream: all of them, or (``continued``) those
    that arrived after an earlier emission of the same trace."""

    trace_id: str
    spans: list[SpanData]
    complete: bool
    annotations: list[Attributes]
    continued: bool
    # ASGI response sends folded on ingest: server span id -> (body sends, first body
    # send's start in unix ns); the sends themselves are not kept (one per chunk)
    body_sends: dict[str, tuple[int, int]]

    def __init__(self, trace_id: str, spans: list[SpanData], complete: bool,
                 annotations: list[Attributes] | None = None, continued: bool = False,
                 body_sends: dict[str, tuple[int, int]] | None = None) -> None:
        self.trace_id = trace_id
        self.spans = spans
        self.complete = complete
        self.annotations = [] if annotations is None else annotations
        self.continued = continued
        self.body_sends = {} if body_sends is None else body_sends


@dataclass(slots=True, init=False)  # a written __init__: see tokenpath/records.py
class _Pending:
    spans: dict[str, SpanData]
    last_seen: float
    root_seen: bool  # a root or a local root: its grace runs
    true_root: bool  # a span without a parent: the trace cannot go on after it
    waited: bool  # given a second idle period: it held no call span yet
    continued: bool
    body_sends: dict[str, tuple[int, int]]
    # span ids that may make room for an important span once the trace is at its cap;
    # None until the cap is first reached
    expendable: list[str] | None
    earliest_nano: int  # the earliest start of a span it was given

    def __init__(self, spans: dict[str, SpanData], last_seen: float,
                 root_seen: bool = False, continued: bool = False) -> None:
        self.earliest_nano = MAX_NANO
        self.spans = spans
        self.last_seen = last_seen
        self.root_seen = root_seen
        self.true_root = False
        self.waited = False
        self.continued = continued
        self.body_sends = {}
        self.expendable = None


class _Emitted:
    """What an open trace has handed on: its span ids (a re-sent one is a duplicate) and
    the ids above them (parents they named that were not handed on: a span arriving with
    one of them belongs to calls already recorded). At most ``MAX_OPEN_SPAN_IDS`` each."""

    __slots__ = ("above", "spans")

    def __init__(self) -> None:
        self.spans: set[str] = set()
        self.above: set[str] = set()

    def add(self, spans: dict[str, SpanData]) -> None:
        room = MAX_OPEN_SPAN_IDS - len(self.spans)  # past it a re-sent span is not caught
        self.spans.update(list(spans)[:max(0, room)])
        for span in spans.values():
            self.add_above(span)
        self.above.difference_update(self.spans)

    def add_above(self, span: SpanData) -> None:
        """``span`` is (or is under) what was handed on: its parent is above it too."""
        parent = span.parent_span_id
        if parent and parent not in self.spans and len(self.above) < MAX_OPEN_SPAN_IDS:
            self.above.add(parent)


MAX_NANO = 2**63 - 1  # no span start yet

ASGI_EVENT_TYPE = "asgi.event.type"  # the ASGI instrumentation's per-message sub-spans
ASGI_BODY_SEND = "http.response.body"


def is_important(span: SpanData) -> bool:
    """Spans a trace at its cap keeps over others: the root, server and client spans,
    engine spans, spans that time a stage or carry gen_ai.* facts."""
    if span.is_root or span.kind in (SPAN_KIND_SERVER, SPAN_KIND_CLIENT) or span.events:
        return True
    if span.name == VLLM_REQUEST_SPAN_NAME or STAGE in span.attributes:
        return True
    return any(key.startswith("gen_ai.") for key in span.attributes)


class Assembler:
    """Buffers spans per trace id with bounded memory and emits finished traces."""

    def __init__(
        self,
        downstream: TraceConsumer,
        config: AssemblerConfig | None = None,
        stats: CollectorStats | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._downstream = downstream
        self._config = config or AssemblerConfig()
        self._config.validate()
        self._stats = stats or CollectorStats()
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: OrderedDict[str, _Pending] = OrderedDict()  # least recently updated first
        self._root_deadlines: deque[tuple[float, str]] = deque()
        self._finished: OrderedDict[str, None] = OrderedDict()
        # traces emitted at their idle timeout without a root: what they emitted
        self._open: OrderedDict[str, _Emitted] = OrderedDict()
        self._annotations: OrderedDict[str, tuple[float, Attributes]] = OrderedDict()
        self._span_count = 0
        # traces handed on and not yet taken by downstream: their earliest span start
        # (earliest_start_unix must see a trace wherever it is)
        self._in_transit: dict[int, int] = {}
        self._flusher: threading.Thread | None = None
        self._stop = threading.Event()
        # Wakes the finalization thread: set on shutdown, and when spans bring a deadline
        # earlier than the one it sleeps until (``_sleep_until``, under the lock; inf
        # while nothing is buffered).
        self._wake = threading.Event()
        self._sleep_until = math.inf
        self._closed = False

    # --- ingest --------------------------------------------------------------------------

    def consume_spans(self, spans: Iterable[SpanData]) -> dict[str, int]:
        """Take decoded spans; never blocks on downstream work.

        Returns the spans refused, by reason (``late``, ``spans_per_trace``), for the
        receiver's partial-success answer. Duplicates are not refused: the span is held.
        """
        now = self._clock()
        evicted: list[AssembledTrace] = []
        cfg = self._config
        stats = self._stats
        late = duplicate = over_limit = summarised = 0
        # The earliest deadline these spans add: a root's grace, a new trace's idle
        # timeout, an annotation's time to live.
        earliest = math.inf
        with self._lock:
            for span in spans:
                if span.name == SPAN_REQUEST_ANNOTATION:
                    self._remember_annotation(span, now)
                    earliest = min(earliest, now + cfg.annotation_ttl_seconds)
                    continue
                trace_id = span.trace_id
                if trace_id in self._finished:
                    late += 1
                    continue
                pending = self._pending.get(trace_id)
                # an open trace (only a continuation is pending for one): what it emitted
                emitted = (self._open.get(trace_id)
                           if pending is None or pending.continued else None)
                if emitted is not None and span.span_id in emitted.above:
                    emitted.add_above(span)  # a span further up is above them as well
                    if is_call_span(span) and not is_outer_hop_span(span):
                        late += 1  # the same call's gateway: not a second request
                        if span.is_root and pending is None:
                            self._open.pop(trace_id)
                            self._remember_finished(trace_id)
                        continue
                    # a client's or proxy's hop goes on (the call joiner joins it), as do
                    # spans of no call (an agent's tool step, its workflow's root)
                if pending is None:
                    if emitted is not None and span.span_id in emitted.spans:
                        duplicate += 1
                        continue
                    if len(self._pending) >= cfg.max_traces:
                        evicted.append(self._evict_oldest())
                    pending = _Pending({}, now, continued=emitted is not None)
                    self._pending[trace_id] = pending
                    earliest = min(earliest, now + cfg.idle_timeout_seconds)
                else:
                    pending.last_seen = now
                    self._pending.move_to_end(trace_id)
                if span.span_id in pending.spans:
                    duplicate += 1
                    continue
                if span.start_unix_nano < pending.earliest_nano:
                    pending.earliest_nano = span.start_unix_nano
                event_type = span.attributes.get(ASGI_EVENT_TYPE)
                if event_type is not None:  # one span per ASGI message: fold, do not keep
                    summarised += 1
                    if event_type == ASGI_BODY_SEND:
                        sends, first = pending.body_sends.get(span.parent_span_id, (0, 0))
                        first = span.start_unix_nano if not sends else min(
                            first, span.start_unix_nano)
                        pending.body_sends[span.parent_span_id] = (sends + 1, first)
                    continue
                if len(pending.spans) >= cfg.max_spans_per_trace:
                    if not self._make_room(pending, span):
                        over_limit += 1
                        continue
                    over_limit += 1  # the expendable span it replaced
                elif pending.expendable is not None and not is_important(span):
                    pending.expendable.append(span.span_id)
                pending.spans[span.span_id] = span
                self._span_count += 1
                if span.is_root:
                    pending.true_root = True
                if (span.is_root or span.is_local_root) and not pending.root_seen:
                    pending.root_seen = True
                    self._root_deadlines.append((now + cfg.root_grace_seconds, trace_id))
                    earliest = min(earliest, now + cfg.root_grace_seconds)
            stats.set_gauges(len(self._pending), self._span_count)
            wake = earliest < self._sleep_until
            if wake:
                self._sleep_until = earliest
        if wake:
            self._wake.set()
        stats.spans_dropped.inc("late", late)
        stats.spans_dropped.inc("duplicate", duplicate)
        stats.spans_dropped.inc("spans_per_trace", over_limit)
        stats.spans_summarised.inc("asgi_message", summarised)
        if evicted:
            stats.traces_evicted.inc("capacity", len(evicted))
            self._emit(evicted)
        return {reason: n for reason, n in (("late", late), ("spans_per_trace", over_limit))
                if n}

    def _make_room(self, pending: _Pending, span: SpanData) -> bool:
        """At the cap, an important span replaces an expendable one (lock held)."""
        if not is_important(span):
            return False
        if pending.expendable is None:  # first time at the cap: list what may go
            pending.expendable = [i for i, s in pending.spans.items() if not is_important(s)]
        while pending.expendable:
            victim = pending.expendable.pop()
            if pending.spans.pop(victim, None) is not None:
                self._span_count -= 1
                return True
        return False

    def _remember_annotation(self, span: SpanData, now: float) -> None:
        request_id = span.attr(GEN_AI_REQUEST_ID)
        if not isinstance(request_id, str) or not request_id:
            self._stats.spans_dropped.inc("annotation_without_request_id")
            return
        # Kept oldest first (expiry reads the head): a request annotated again moves to
        # the end.
        if self._annotations.pop(request_id, None) is None and (
                len(self._annotations) >= self._config.max_annotations):
            self._annotations.popitem(last=False)
            self._stats.spans_dropped.inc("annotation_capacity")
        self._annotations[request_id] = (now, dict(span.attributes))

    def _evict_oldest(self) -> AssembledTrace:
        trace_id, pending = self._pending.popitem(last=False)
        return self._finish(trace_id, pending, complete=False)

    def _remember_finished(self, trace_id: str) -> None:
        """Spans of ``trace_id`` that arrive from now on are late (lock held)."""
        self._finished[trace_id] = None
        if len(self._finished) > self._config.finished_memory:
            self._finished.popitem(last=False)

    def _finish(self, trace_id: str, pending: _Pending, complete: bool,
                keep_open: bool = False) -> AssembledTrace:
        """Hand a trace's pending spans on (lock held): finished, or (``keep_open``) open
        for the spans of its later calls."""
        self._span_count -= len(pending.spans)
        if keep_open:
            emitted = self._open.pop(trace_id, None) or _Emitted()
            emitted.add(pending.spans)
            self._open[trace_id] = emitted
            if len(self._open) > self._config.open_memory:
                self._open.popitem(last=False)
        else:
            self._open.pop(trace_id, None)
            self._remember_finished(trace_id)
        spans = list(pending.spans.values())
        self._in_transit[id(spans)] = pending.earliest_nano
        annotations = []
        for span in spans:
            request_id = span.attributes.get(GEN_AI_REQUEST_ID)
            if isinstance(request_id, str):
                found = self._annotations.pop(request_id, None)
                if found is not None:
                    annotations.append(found[1])
        return AssembledTrace(trace_id, spans, complete, annotations, pending.continued,
                              pending.body_sends)

    # --- finalization --------------------------------------------------------------------

    def tick(self) -> int:
        """Finalize every trace that is due; returns how many were emitted."""
        now = self._clock()
        cfg = self._config
        done: list[AssembledTrace] = []
        idle_cutoff = now - cfg.idle_timeout_seconds
        with self._lock:
            while self._root_deadlines and self._root_deadlines[0][0] <= now:
                _, trace_id = self._root_deadlines.popleft()
                pending = self._pending.pop(trace_id, None)
                if pending is not None:  # after a local root only, later calls may follow
                    done.append(self._finish(trace_id, pending, complete=True,
                                             keep_open=not pending.true_root))
            while self._pending:
                trace_id, pending = next(iter(self._pending.items()))
                if pending.last_seen > idle_cutoff:
                    break
                if not pending.root_seen and not pending.waited and not any(
                        is_call_span(s) for s in pending.spans.values()):
                    # nothing of an LLM call yet (a stage span of a long stream whose
                    # server span ends later): one more idle period before it goes alone
                    pending.waited = True
                    pending.last_seen = now
                    self._pending.move_to_end(trace_id)
                    continue
                del self._pending[trace_id]
                # without its root the trace may go on (an agent's next call): keep it open
                done.append(self._finish(trace_id, pending, complete=pending.root_seen,
                                         keep_open=not pending.true_root))
            ttl_cutoff = now - cfg.annotation_ttl_seconds
            expired = 0
            while self._annotations:
                request_id, (seen, _) = next(iter(self._annotations.items()))
                if seen > ttl_cutoff:
                    break
                del self._annotations[request_id]
                expired += 1
            self._stats.set_gauges(len(self._pending), self._span_count)
        incomplete = sum(1 for t in done if not t.complete)
        self._stats.traces_evicted.inc("idle_timeout", incomplete)
        self._stats.spans_dropped.inc("annotation_unmatched", expired)
        self._emit(done)
        return len(done)

    def flush(self) -> int:
        """Finalize everything buffered now (clean shutdown)."""
        with self._lock:
            done = [
                self._finish(trace_id, pending, complete=pending.root_seen)
                for trace_id, pending in self._pending.items()
            ]
            self._pending.clear()
            self._root_deadlines.clear()
            self._stats.set_gauges(0, self._span_count)
        self._emit(done)
        return len(done)

    def _emit(self, traces: list[AssembledTrace]) -> None:
        for trace in traces:
            try:
                self._downstream.consume_trace(trace)
            except Exception:
                log.exception("downstream failed on trace %s", trace.trace_id)
                self._stats.pipeline_errors.inc(PIPELINE_STEP_HAND_OFF)
        if traces:
            with self._lock:
                for trace in traces:
                    self._in_transit.pop(id(trace.spans), None)

    def earliest_start_unix(self) -> float:
        """The earliest span start (unix seconds) among the traces held or being handed
        on: what a forwarding replica may still make records of (inf: none)."""
        with self._lock:
            earliest = min((p.earliest_nano for p in self._pending.values()),
                           default=MAX_NANO)
            if self._in_transit:
                earliest = min(earliest, min(self._in_transit.values()))
        return math.inf if earliest >= MAX_NANO else earliest / 1e9

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        if self._flusher is not None:
            return
        self._flusher = threading.Thread(target=self._run, name="tokenpath-assembler", daemon=True)
        self._flusher.start()

    def _next_due(self) -> float | None:
        """When the next trace or annotation falls due (lock held); None when nothing is
        buffered. Root deadlines, last-seen times and annotations are each kept oldest
        first, so only their heads are read."""
        cfg = self._config
        dues: list[float] = []
        if self._root_deadlines:
            dues.append(self._root_deadlines[0][0])
        if self._pending:
            dues.append(next(iter(self._pending.values())).last_seen + cfg.idle_timeout_seconds)
        if self._annotations:
            dues.append(next(iter(self._annotations.values()))[0] + cfg.annotation_ttl_seconds)
        return min(dues) if dues else None

    def _run(self) -> None:
        """Sleeps until the next trace falls due (at least ``tick_seconds``), or, with
        nothing buffered, until spans arrive: an idle collector does not wake for it.
        Spans that bring an earlier deadline wake it."""
        tick_seconds = self._config.tick_seconds
        while True:
            with self._lock:
                due = self._next_due()
                now = self._clock()
                self._sleep_until = math.inf if due is None else max(due, now + tick_seconds)
                self._wake.clear()
                # After the clear, under the lock: a shutdown that set _wake before the
                # clear has set _stop too, and is seen here.
                if self._stop.is_set():
                    return
            self._wake.wait(None if due is None
                            else min(self._sleep_until - now, MAX_SLEEP_SECONDS))
            if self._stop.is_set():
                return
            try:
                self.tick()
            except Exception:
                log.exception("assembler tick failed")

    def shutdown(self) -> None:
        """Stop ticking, flush every buffered trace downstream, shut downstream. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._wake.set()
        if self._flusher is not None:
            self._flusher.join()
        self.flush()
        self._downstream.shutdown()

    @property
    def traces_in_flight(self) -> int:
        return len(self._pending)

    @property
    def spans_buffered(self) -> int:
        """Spans held now (what admission compares with ``max_buffered_spans``)."""
        return self._span_count
