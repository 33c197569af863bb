"""The one serialized stage after the assembler: mapping, pricing and the sinks.

The assembler (its own thread, and receiver threads when they evict a trace) and the
record-log receiver (records forwarded by other replicas) feed one queue; one worker thread
drains it through the stage mapper, the cost attributor (or the record forwarder) and the
sinks, and runs the tickers' ``tick()`` between items. Everything downstream of the queue
therefore runs on a single thread: the attributor holds no lock, and the Prometheus sink's
counters, written by that thread alone, never lose an update.

Bounded steps (docs/cost-model.md, "Bounded steps"): no thread holds the GIL for long.
The compiled core never releases the GIL by itself, so a large close (a burst of
thousands of requests, a backlog) would hold it until done and stall the receivers,
``/metrics`` and the API. The attributor only queues its closes as records arrive;
after each item (a trace, or ``records_per_step`` records of a forwarded batch) and each
tick the worker runs its queued work in steps of bounded size
(``cost.max_slices_per_step`` slices, ``cost.max_records_per_step`` records) and gives
up the GIL between two (``GilYield``: a thread waiting for it takes it there).

Backpressure (collector/backpressure.py): the receivers answer 429 / UNAVAILABLE while
the queue is at or past its high-water mark (:meth:`PipelineWorker.backlog`), before they
read a body. Nothing ever waits to put into the queue and nothing is ever refused by it
(a receiver thread that evicts a trace may be the HTTP event loop), so its depth is
bounded by admission: the high-water mark plus the traces the assembler already holds.
The worker itself may wait: the store's bounded queue makes it wait while the store is
behind, and the queue then fills past its mark, so the receivers refuse.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import NamedTuple

from tokenpath.collector.assembler import AssembledTrace
from tokenpath.collector.backpressure import Backlog
from tokenpath.collector.cost.sources import SourceProgress
from tokenpath.collector.interfaces import (
    ForwardedPartsConsumer,
    Stepped,
    Ticking,
    TraceConsumer,
)
from tokenpath.collector.stats import (
    PIPELINE_STEP_PRICING,
    PIPELINE_STEP_RECORDS,
    PIPELINE_STEP_TRACE,
    CollectorStats,
)
from tokenpath.config import ConfigError
from tokenpath.records import RequestRecord

log = logging.getLogger(__name__)

# ``pipeline_shed_at``: the queue's depth (assembled traces or record batches waiting) from
# which the receivers shed load. The queue itself is unbounded: admission bounds its depth.
DEFAULT_SHED_AT = 10_000
# forwarded records taken between two GIL releases (the attributor's own steps are bounded
# by its configuration)
DEFAULT_RECORDS_PER_STEP = 200


_STOP = object()


class _Forwarded(NamedTuple):
    records: list[RequestRecord]
    sources: Sequence[str | None]
    progress: Sequence[SourceProgress]
    priced_parts: Sequence[RequestRecord]


class _Queued(NamedTuple):
    sequence: int
    trace: AssembledTrace


class QueuedStarts:
    """The earliest span start among the traces queued and not yet mapped, for a
    forwarding replica's progress (collector/forward_progress.py). Traces leave the queue
    in the order they entered, so a monotonic deque gives the minimum."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0
        self._starts: deque[tuple[int, float]] = deque()  # (sequence, start) increasing

    def push(self, trace: AssembledTrace) -> int:
        start = min((s.start_unix_nano for s in trace.spans), default=0) / 1e9
        with self._lock:
            sequence = self._next
            self._next += 1
            while self._starts and self._starts[-1][1] >= start:
                self._starts.pop()
            self._starts.append((sequence, start))
        return sequence

    def pop(self, sequence: int) -> None:
        with self._lock:
            while self._starts and self._starts[0][0] <= sequence:
                self._starts.popleft()

    def earliest(self) -> float:
        with self._lock:
            return self._starts[0][1] if self._starts else math.inf


# Between two steps the worker gives up the GIL (``time.sleep(0)``), and once it has held
# it this long since its last pause it pauses for real: a thread waiting for the GIL
# (a receiver, a scrape) takes it at once instead of after its own switch interval (5 ms).
HOLD_SECONDS = 0.002
PAUSE_SECONDS = 50e-6


class GilYield:
    """The worker's hook between two steps: gives up the GIL, pausing for
    ``PAUSE_SECONDS`` once the worker has run ``HOLD_SECONDS`` since its last pause (at
    most a fortieth of its time)."""

    def __init__(self) -> None:
        self._since = time.perf_counter()

    def __call__(self) -> None:
        if time.perf_counter() - self._since >= HOLD_SECONDS:
            time.sleep(PAUSE_SECONDS)
            self._since = time.perf_counter()
        else:
            time.sleep(0)


class PipelineWorker:
    """TraceConsumer for the assembler; runs ``traces`` (the mapper, whose downstream is
    the attributor or the forwarder), ``records`` (forwarded records to price) and
    each ticker's ``tick()`` (the call joiner's, the attributor's) on one thread; each of
    ``stepped`` gives up the GIL between two of its steps."""

    def __init__(self, traces: TraceConsumer, records: ForwardedPartsConsumer | None,
                 tickers: Sequence[Ticking] = (), stats: CollectorStats | None = None,
                 shed_at: int = DEFAULT_SHED_AT,
                 clock: Callable[[], float] = time.monotonic,
                 track_starts: bool = False,
                 stepped: Sequence[Stepped] = (),
                 records_per_step: int = DEFAULT_RECORDS_PER_STEP) -> None:
        """``track_starts``: keep :attr:`queued_starts` (a forwarding replica's progress
        needs the earliest start of what it has not mapped yet). Each of ``stepped`` runs
        its queued work in bounded steps, the GIL given up between two."""
        if shed_at < 1:
            raise ConfigError("pipeline_shed_at", "must be >= 1")
        if records_per_step < 1:
            raise ConfigError("cost.max_records_per_step", "must be >= 1")
        self._give_up_gil = GilYield()
        for component in stepped:
            component.yield_between_steps(self._give_up_gil)
        self._stepped = tuple(stepped)
        self._records_per_step = records_per_step
        self._traces = traces
        self._records = records
        self._tickers = tuple(tickers)
        self._stats = stats or CollectorStats()
        self._queue: queue.Queue[object] = queue.Queue()  # bounded by admission, see above
        self._high_water = shed_at  # receivers shed load from here on
        self._clock = clock
        self._thread: threading.Thread | None = None
        self._closed = False
        self.queued_starts = QueuedStarts() if track_starts else None

    # --- feeding -------------------------------------------------------------------------

    def consume_trace(self, trace: AssembledTrace) -> None:
        """From the assembler; never blocks (receivers shed load past the high water)."""
        if self._thread is None:
            self._run_trace(trace)
            self._run_steps()
            return
        if self.queued_starts is not None:
            self._queue.put(_Queued(self.queued_starts.push(trace), trace))
        else:
            self._queue.put(trace)

    def offer_records(self, records: list[RequestRecord],
                      sources: Sequence[str | None] = (),
                      progress: Sequence[SourceProgress] = (),
                      priced_parts: Sequence[RequestRecord] = ()) -> bool:
        """From the record-log receiver: forwarded records (``sources``: each one's
        replica), progress messages and priced parts. False (nothing taken) while
        overloaded."""
        if self._records is None:
            raise RuntimeError("this collector does not price forwarded records")
        batch = _Forwarded(records, sources, progress, priced_parts)
        if self._thread is None:
            self._run_records(batch)
            self._run_steps()
            return True
        if self.overloaded:
            return False
        self._queue.put(batch)
        return True

    @property
    def overloaded(self) -> bool:
        return self._queue.qsize() >= self._high_water

    def backlog(self) -> Backlog:
        """The queue as admission sees it (traces and record batches waiting)."""
        return Backlog("pipeline queue", self._queue.qsize, self._high_water)

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="tokenpath-pipeline",
                                        daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        """Drain the queue, stop the worker, then shut downstream (which flushes).
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join()
        self._traces.shutdown()

    # --- the worker ----------------------------------------------------------------------

    def _tick_interval(self) -> float | None:
        intervals = [t.tick_seconds for t in self._tickers if t.tick_seconds > 0]
        return min(intervals) if intervals else None

    def _run(self) -> None:
        interval = self._tick_interval()
        next_tick = self._clock() + interval if interval is not None else None
        while True:
            timeout = None if next_tick is None else max(0.0, next_tick - self._clock())
            try:
                item = self._queue.get(timeout=timeout)
            except queue.Empty:
                item = None
            if item is _STOP:
                self._run_steps()
                return
            if isinstance(item, AssembledTrace):
                self._run_trace(item)
            elif isinstance(item, _Queued):
                self._run_trace(item.trace)
                assert self.queued_starts is not None
                self.queued_starts.pop(item.sequence)
            elif isinstance(item, _Forwarded):
                self._run_records(item)
            self._run_steps()
            if next_tick is not None and interval is not None and self._clock() >= next_tick:
                self._tick()
                self._run_steps()
                next_tick = self._clock() + interval
            self._stats.pipeline_queue_depth.set(self._queue.qsize())

    def _run_trace(self, trace: AssembledTrace) -> None:
        try:
            self._traces.consume_trace(trace)
        except Exception:
            log.exception("pipeline: trace %s failed downstream", trace.trace_id)
            self._stats.pipeline_errors.inc(PIPELINE_STEP_TRACE)

    def _run_records(self, batch: _Forwarded) -> None:
        """Forwarded records, ``records_per_step`` at a time, each part's queued pricing
        run before the next part is taken; then priced parts and progress messages."""
        assert self._records is not None
        sources = batch.sources
        for index, record in enumerate(batch.records):
            if index and index % self._records_per_step == 0:
                self._run_steps()
                self._give_up_gil()
            try:
                self._records.consume_forwarded(
                    record, sources[index] if index < len(sources) else None)
            except Exception:
                log.exception("pipeline: forwarded record %s failed downstream",
                              record.trace_id)
                self._stats.pipeline_errors.inc(PIPELINE_STEP_RECORDS)
        for part in batch.priced_parts:
            try:
                self._records.consume_priced_part(part)
            except Exception:
                log.exception("pipeline: priced part %s failed downstream", part.record_id)
                self._stats.pipeline_errors.inc(PIPELINE_STEP_RECORDS)
        for mark in batch.progress:
            try:
                self._records.consume_progress(mark)
            except Exception:
                log.exception("pipeline: progress of %s for %s failed downstream",
                              mark.source, mark.unit)
                self._stats.pipeline_errors.inc(PIPELINE_STEP_RECORDS)

    def _run_steps(self) -> None:
        """Run each stepped component's queued work, one bounded step at a time, giving up
        the GIL between two."""
        for component in self._stepped:
            while True:
                try:
                    more = component.step()
                except Exception:  # its failed step's work is dropped, the rest goes on
                    log.exception("pipeline: a pricing step of %s failed",
                                  type(component).__name__)
                    self._stats.pipeline_errors.inc(PIPELINE_STEP_PRICING)
                    more = True
                if not more:
                    break
                self._give_up_gil()

    def _tick(self) -> None:
        for ticker in self._tickers:
            try:
                ticker.tick()
            except Exception:  # a failing sink must not kill the worker
                log.exception("pipeline: tick of %s failed", type(ticker).__name__)
