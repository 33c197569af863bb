"""The serialized stage after the assembler (collector/pipeline_worker.py): one thread
maps, prices and writes the sinks; ticks close slices without traffic; producers on
several threads never lose a counter update."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from testkit.fakes.clock import FakeClock
from testkit.fakes.spans import new_trace_id, span
from tests.collector.conftest import wait_for
from tests.collector.cost.helpers import RecordingSink, engine_record
from tokenpath import attributes as A
from tokenpath import metric_names as M
from tokenpath.collector.assembler import AssembledTrace, Assembler, AssemblerConfig
from tokenpath.collector.cost.attributor import AttributorConfig, CostAttributor
from tokenpath.collector.cost.prices import load_price_sheet
from tokenpath.collector.fan_out import FanOut
from tokenpath.collector.mapping import StageMapper
from tokenpath.collector.pipeline_worker import PipelineWorker
from tokenpath.collector.prometheus_sink import PrometheusSink
from tokenpath.collector.spans import SPAN_KIND_SERVER
from tokenpath.collector.stats import CollectorStats

PRICES = load_price_sheet()


def test_the_worker_ticks_the_attributor_without_new_traffic() -> None:
    sink = RecordingSink()
    clock = FakeClock(0.0)
    cost = CostAttributor(sink, PRICES, clock=clock,
                          config=AttributorConfig(min_delay_seconds=0, max_delay_seconds=0,
                                                  tick_seconds=0.01))
    delivered = threading.Event()
    original = sink.consume_record

    def consume(record):  # type: ignore[no-untyped-def]
        original(record)
        delivered.set()

    sink.consume_record = consume  # type: ignore[method-assign]
    worker = PipelineWorker(StageMapper(cost), cost, (cost,))
    worker.start()
    assert worker.offer_records([engine_record(0, 0.0, 0.1, 0.9)])
    clock.now = 5.0
    assert delivered.wait(timeout=30)
    worker.shutdown()
    assert sink.shutdowns == 1


def _engine_trace(index: int, rng: random.Random) -> AssembledTrace:
    tid = new_trace_id()
    start = 1_000.0 + index * 0.01
    attributes = {
        A.GEN_AI_REQUEST_MODEL: "llama-3.1-8b",
        A.VLLM_USAGE_PROMPT_TOKENS: rng.randint(10, 2000),
        A.VLLM_USAGE_COMPLETION_TOKENS: 7,
        A.VLLM_LATENCY_TIME_IN_QUEUE: 0.001,
        A.VLLM_LATENCY_TIME_IN_MODEL_PREFILL: 0.02,
        A.VLLM_LATENCY_TIME_IN_MODEL_DECODE: 0.3,
    }
    engine = span(tid, A.VLLM_REQUEST_SPAN_NAME, kind=SPAN_KIND_SERVER, start=start,
                  end=start + 0.33, attributes=attributes,
                  resource={A.SERVICE_INSTANCE_ID: f"engine-{index % 3}"})
    return AssembledTrace(tid, [engine], True, [])


def test_producers_on_many_threads_lose_no_counter_update() -> None:
    """Eight threads push spans into an assembler that evicts on capacity (so records are
    emitted from the producers' threads), while its own thread and the pricing tick run:
    every request and every output token is counted exactly once on /metrics."""
    producers, per_producer = 8, 400
    stats = CollectorStats()
    prometheus = PrometheusSink(stats=stats)
    cost = CostAttributor(FanOut([prometheus]), PRICES,
                          config=AttributorConfig(min_delay_seconds=0, max_delay_seconds=0,
                                                  tick_seconds=0.001))
    worker = PipelineWorker(StageMapper(cost, stats), cost, (cost,), stats, shed_at=32)
    assembler = Assembler(worker, AssemblerConfig(max_traces=16, root_grace_seconds=0,
                                                  tick_seconds=0.001), stats)
    worker.start()
    assembler.start()
    barrier = threading.Barrier(producers)

    def produce(seed: int) -> None:
        rng = random.Random(seed)
        barrier.wait()
        for i in range(per_producer):
            trace = _engine_trace(seed * per_producer + i, rng)
            assembler.consume_spans(trace.spans)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(producers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assembler.shutdown()  # flushes through the worker, which shuts the attributor
    total = producers * per_producer
    samples = [sample for family in text_string_to_metric_families(prometheus.render())
               for sample in family.samples]
    assert sum(s.value for s in samples if s.name == M.REQUESTS.series) == total
    assert sum(s.value for s in samples if s.name == M.TOKENS.series
               and s.labels[M.LABEL_KIND] == M.TOKEN_KIND_OUTPUT) == total * 7
    assert cost.stats.records_out.value == total


class _Blocked:
    """A mapper stand-in that holds the worker until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.seen = 0

    def consume_trace(self, trace: AssembledTrace) -> None:
        self.release.wait(30)
        self.seen += 1

    def shutdown(self) -> None:
        pass


def test_a_backed_up_worker_sheds_load_at_the_receivers() -> None:
    from tokenpath.collector.limits import IngestLimits
    from tokenpath.collector.node_metrics import NodeMetricsState
    from tokenpath.collector.receivers.ingest import OtlpIngest, Overloaded

    blocked = _Blocked()
    stats = CollectorStats()
    worker = PipelineWorker(blocked, RecordingSink(), (), stats, shed_at=2)
    ingest = OtlpIngest(Assembler(worker), NodeMetricsState(), IngestLimits(), stats,
                        records=worker, record_backlogs=[worker.backlog()])
    worker.start()
    rng = random.Random(3)
    for i in range(3):  # one held by the worker, two queued: the high-water mark
        worker.consume_trace(_engine_trace(i, rng))
    wait_for_condition(lambda: worker.overloaded)
    try:
        ingest.admit_traces()
    except Overloaded as exc:
        assert exc.retry_after > 0
    else:
        raise AssertionError("admitted while the pipeline is backed up")
    assert not worker.offer_records([])  # forwarded records are refused too
    blocked.release.set()
    wait_for_condition(lambda: not worker.overloaded)
    ingest.admit_traces()
    worker.shutdown()
    assert blocked.seen == 3


def wait_for_condition(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    wait_for(predicate, timeout)
