"""Assembler rules: out of order, duplicates, missing roots, capacity, late spans."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from testkit.fakes.clock import FakeClock
from testkit.fakes.spans import TraceSink, new_trace_id, span
from tokenpath import attributes as A
from tokenpath.collector.assembler import Assembler, AssemblerConfig
from tokenpath.collector.stats import CollectorStats

GRACE = 1.0
IDLE = 30.0


def make(max_traces: int = 100, max_spans: int = 100) -> tuple[Assembler, TraceSink,
                                                                FakeClock, CollectorStats]:
    sink, clock, stats = TraceSink(), FakeClock(), CollectorStats()
    config = AssemblerConfig(max_traces=max_traces, max_spans_per_trace=max_spans,
                             root_grace_seconds=GRACE, idle_timeout_seconds=IDLE)
    return Assembler(sink, config, stats, clock), sink, clock, stats


def test_out_of_order_spans_join_into_one_trace() -> None:
    asm, sink, clock, _ = make()
    tid = new_trace_id()
    root = span(tid, "root", span_id="a" * 16)
    child = span(tid, "child", parent=root.span_id)
    grandchild = span(tid, "grandchild", parent=child.span_id)
    asm.consume_spans([grandchild])
    clock.advance(0.3)
    asm.consume_spans([root])  # root before its child: still waits for the grace period
    clock.advance(0.3)
    asm.consume_spans([child])
    assert asm.tick() == 0
    clock.advance(GRACE)
    assert asm.tick() == 1
    (trace,) = sink.traces
    assert trace.complete is True
    assert {s.name for s in trace.spans} == {"root", "child", "grandchild"}


def test_same_span_twice_counts_once() -> None:
    asm, sink, clock, stats = make()
    tid = new_trace_id()
    root = span(tid, "root")
    asm.consume_spans([root, root])
    asm.consume_spans([root])
    clock.advance(GRACE)
    asm.tick()
    assert len(sink.traces[0].spans) == 1
    assert stats.spans_dropped["duplicate"] == 2


def test_trace_without_root_is_incomplete_after_idle_timeout() -> None:
    """Without a root, and without any LLM call span yet, a trace waits a second idle
    period (its call's spans may still come), then goes as incomplete."""
    asm, sink, clock, stats = make()
    tid = new_trace_id()
    asm.consume_spans([span(tid, "orphan", parent="b" * 16)])
    clock.advance(IDLE - 0.01)
    assert asm.tick() == 0
    clock.advance(0.02)
    assert asm.tick() == 0  # no call span: one more idle period
    clock.advance(IDLE - 0.02)
    assert asm.tick() == 0
    clock.advance(0.04)
    assert asm.tick() == 1
    assert sink.traces[0].complete is False
    assert stats.traces_evicted["idle_timeout"] == 1


def test_eviction_over_capacity_is_counted_and_keeps_data() -> None:
    asm, sink, clock, stats = make(max_traces=3)
    ids = [new_trace_id() for _ in range(5)]
    for tid in ids:
        asm.consume_spans([span(tid, "orphan", parent="c" * 16)])
        clock.advance(0.01)
    assert asm.traces_in_flight == 3
    assert stats.traces_evicted["capacity"] == 2
    assert [t.trace_id for t in sink.traces] == ids[:2]  # least recently updated go first
    assert all(not t.complete for t in sink.traces)


def test_late_span_after_finalization_is_dropped_not_a_second_record() -> None:
    asm, sink, clock, stats = make()
    tid = new_trace_id()
    root = span(tid, "root")
    asm.consume_spans([root])
    clock.advance(GRACE)
    asm.tick()
    asm.consume_spans([span(tid, "late child", parent=root.span_id)])
    clock.advance(IDLE * 2)
    asm.tick()
    assert len(sink.traces) == 1
    assert stats.spans_dropped["late"] == 1


def test_spans_per_trace_limit_is_counted() -> None:
    asm, sink, _, stats = make(max_spans=2)
    tid = new_trace_id()
    asm.consume_spans([span(tid, f"s{i}", parent="d" * 16) for i in range(5)])
    asm.flush()
    assert len(sink.traces[0].spans) == 2
    assert stats.spans_dropped["spans_per_trace"] == 3


def test_annotation_joins_by_request_id_and_is_not_a_trace() -> None:
    asm, sink, clock, _ = make()
    annotation = span(new_trace_id(), A.SPAN_REQUEST_ANNOTATION,
                      attributes={A.GEN_AI_REQUEST_ID: "req-1", A.CACHED_TOKENS: 64})
    tid = new_trace_id()
    engine = span(tid, A.VLLM_REQUEST_SPAN_NAME, attributes={A.GEN_AI_REQUEST_ID: "req-1"})
    asm.consume_spans([annotation])
    asm.consume_spans([engine])
    clock.advance(GRACE)
    asm.tick()
    (trace,) = sink.traces
    assert trace.trace_id == tid
    assert trace.annotations == [{A.GEN_AI_REQUEST_ID: "req-1", A.CACHED_TOKENS: 64}]


def test_shutdown_flushes_everything_and_is_idempotent() -> None:
    asm, sink, _, _ = make()
    asm.start()
    asm.consume_spans([span(new_trace_id(), "root"), span(new_trace_id(), "o", parent="e" * 16)])
    asm.shutdown()
    asm.shutdown()
    assert len(sink.traces) == 2
    assert sink.shut == 1


def _wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_an_idle_finalization_thread_sleeps_until_spans_arrive() -> None:
    # Each turn of the thread's loop (and each tick) reads the clock on the thread: with
    # nothing buffered it reads it once, to work out that it sleeps until spans arrive.
    thread_reads: list[float] = []

    def clock() -> float:
        now = time.monotonic()
        if threading.current_thread() is asm._flusher:
            thread_reads.append(now)
        return now

    sink, stats = TraceSink(), CollectorStats()
    asm = Assembler(sink, AssemblerConfig(root_grace_seconds=0.05, tick_seconds=0.01), stats,
                    clock=clock)
    asm.start()
    try:
        assert _wait_for(lambda: len(thread_reads) == 1)
        time.sleep(0.3)
        assert len(thread_reads) == 1  # nothing buffered: it never woke (30 ticks at 0.01 s)
        asm.consume_spans([span(new_trace_id(), "root")])
        assert _wait_for(lambda: len(sink.traces) == 1)
    finally:
        asm.shutdown()


@pytest.mark.parametrize("idle_timeout", [30.0, float("inf")])
def test_a_root_after_a_rootless_trace_is_finalized_at_its_own_grace(
        idle_timeout: float) -> None:
    # The thread sleeps until the rootless trace's idle timeout (30 s, or an hour at a
    # time for an unbounded one); a root that arrives meanwhile brings an earlier
    # deadline and must wake it.
    sink, stats = TraceSink(), CollectorStats()
    asm = Assembler(sink, AssemblerConfig(root_grace_seconds=0.05,
                                          idle_timeout_seconds=idle_timeout,
                                          tick_seconds=0.01), stats)
    asm.start()
    try:
        asm.consume_spans([span(new_trace_id(), "child", parent="e" * 16)])
        time.sleep(0.1)
        assert asm._flusher is not None and asm._flusher.is_alive()
        rooted = new_trace_id()
        asm.consume_spans([span(rooted, "root")])
        assert _wait_for(lambda: [t.trace_id for t in sink.traces] == [rooted], timeout=5.0)
    finally:
        asm.shutdown()


def test_a_shutdown_landing_while_the_thread_computes_its_sleep_is_not_lost() -> None:
    # shutdown() sets _stop and _wake without the lock; when that lands while the thread
    # is working out its next sleep (before it clears _wake), the thread must still stop.
    armed = threading.Event()
    stopper: list[threading.Thread] = []

    def clock() -> float:
        if armed.is_set() and threading.current_thread() is asm._flusher:
            armed.clear()
            stopper.append(threading.Thread(target=asm.shutdown, daemon=True))
            stopper[0].start()
            _wait_for(asm._stop.is_set)  # shutdown has set _stop and _wake, and joins
        return time.monotonic()

    asm = Assembler(TraceSink(), AssemblerConfig(), CollectorStats(), clock)
    asm.start()
    time.sleep(0.05)  # the thread sleeps with nothing buffered
    armed.set()
    asm._wake.set()  # as spans would: it wakes, ticks and computes its next sleep
    assert _wait_for(lambda: bool(stopper))
    stopper[0].join(timeout=10)
    assert not stopper[0].is_alive()


def test_a_request_annotated_again_expires_after_its_latest_annotation() -> None:
    asm, sink, clock, stats = make()
    ttl = AssemblerConfig().annotation_ttl_seconds

    def annotate(request_id: str) -> None:
        asm.consume_spans([span(new_trace_id(), A.SPAN_REQUEST_ANNOTATION,
                                attributes={A.GEN_AI_REQUEST_ID: request_id})])

    annotate("req-a")
    clock.advance(1.0)
    annotate("req-b")
    clock.advance(1.0)
    annotate("req-a")  # now the newest
    clock.advance(ttl - 0.5)  # past req-b's time to live, not req-a's second one
    asm.tick()
    assert stats.spans_dropped.get("annotation_unmatched") == 1
    engine = span(new_trace_id(), A.VLLM_REQUEST_SPAN_NAME,
                  attributes={A.GEN_AI_REQUEST_ID: "req-a"})
    asm.consume_spans([engine])
    clock.advance(GRACE)
    asm.tick()
    (trace,) = sink.traces
    assert trace.annotations == [{A.GEN_AI_REQUEST_ID: "req-a"}]
