"""Where the collector's CPU goes, stage by stage, in one process on one thread.

The same payloads as ``bench.ingest`` (both shapes) go through the real components one
stage at a time, each stage over every trace before the next starts: decode and buffer
(the ingest path, with the native decoder where it is built; the pure-Python reference
decoder is timed beside it), assemble (the assembler's flush), map and join (the
stage mapper and call joiner), price (the cost attributor), the Prometheus sink, and the
store (its batch write, synchronously). CPU seconds per stage, per span and per trace,
against the parse-and-read floor of the same payloads. The transport (HTTP or gRPC) and
the threads' hand-offs are what the whole-collector figure of ``bench.ingest`` adds.

Garbage collection is counted apart (``gc_us_per_trace``, by stage): every stage starts
after a full collection, and the time of each collection that runs during a stage is
taken out of that stage's figure. The objects a collection walks are the ones every
earlier stage left alive (this bench keeps all of them, both shapes' payloads and
traces included), so without it one middle-generation collection falling in a stage
made that stage look several times its cost (pricing: 207 ms, 157 ms of it one
collection, for 1,500 reference-path records).

    python -m bench.pipeline_stages
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.payloads import (
    SHAPE_REFERENCE_PATH,
    SHAPE_STAGE_SPANS,
    make_requests,
    parse_floor,
    reference_path_requests,
)
from tokenpath.collector.assembler import AssembledTrace, Assembler, AssemblerConfig
from tokenpath.collector.call_join import CallJoiner, JoinConfig
from tokenpath.collector.cost.attributor import AttributorConfig, CostAttributor
from tokenpath.collector.cost.prices import load_price_sheet
from tokenpath.collector.gc_tuning import DEFAULT_GC_YOUNG_THRESHOLD, tune_gc
from tokenpath.collector.limits import IngestLimits
from tokenpath.collector.mapping import StageMapper
from tokenpath.collector.node_metrics import NodeMetricsState
from tokenpath.collector.prometheus_sink import PrometheusSink
from tokenpath.collector.receivers.ingest import OtlpIngest
from tokenpath.collector.receivers.otlp_decode import (
    native_decoder_available,
    parse_trace_request,
)
from tokenpath.collector.stats import CollectorStats
from tokenpath.collector.store import RecordStore, StoreConfig
from tokenpath.records import IdleCost, RequestRecord

REFERENCE_DECODER = "reference decoder: parse, decode and buffer (not in the sum)"
_ASSEMBLE_AT_SHUTDOWN = AssemblerConfig(root_grace_seconds=3600, idle_timeout_seconds=3600,
                                        max_traces=10**6)


class _Collect:
    """Keeps what a stage hands on: traces, records, idle slices."""

    def __init__(self) -> None:
        self.traces: list[AssembledTrace] = []
        self.records: list[RequestRecord] = []
        self.idle: list[IdleCost] = []

    def consume_trace(self, trace: AssembledTrace) -> None:
        self.traces.append(trace)

    def consume_record(self, record: RequestRecord) -> None:
        self.records.append(record)

    def consume_idle_cost(self, idle: IdleCost) -> None:
        self.idle.append(idle)

    def shutdown(self) -> None:
        pass


class _CollectionClock:
    """CPU seconds spent in garbage collections since the last :meth:`take`."""

    def __init__(self) -> None:
        self._started = 0.0
        self._spent = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.process_time()
        else:
            self._spent += time.process_time() - self._started

    def take(self) -> float:
        spent, self._spent = self._spent, 0.0
        return spent


_COLLECTIONS = _CollectionClock()


def _start() -> float:
    """A stage starts: a full collection first (not counted), then the clock."""
    gc.collect()
    _COLLECTIONS.take()
    return time.process_time()


def _timed(stage: dict[str, float], collected: dict[str, float], name: str,
           started: float) -> None:
    """The stage's CPU since ``started``, less the collections that ran in it (kept in
    ``collected``)."""
    spent = time.process_time() - started
    in_gc = _COLLECTIONS.take()
    stage[name] = spent - in_gc
    collected[name] = in_gc


def measure(payloads: list[bytes], store_dir: Path) -> dict[str, Any]:
    gc.callbacks.append(_COLLECTIONS)
    try:
        return _measure(payloads, store_dir)
    finally:
        gc.callbacks.remove(_COLLECTIONS)


def _measure(payloads: list[bytes], store_dir: Path) -> dict[str, Any]:
    stats = CollectorStats()
    cpu: dict[str, float] = {}
    collected: dict[str, float] = {}
    t = _start()
    spans = parse_floor(payloads)
    _timed(cpu, collected, "floor (parse and read every field)", t)

    # For comparison, not in the sum: protobuf's parser and the pure-Python decoder.
    reference_stats = CollectorStats()
    reference = OtlpIngest(Assembler(_Collect(), _ASSEMBLE_AT_SHUTDOWN, reference_stats),
                           NodeMetricsState(), IngestLimits(), reference_stats)
    t = _start()
    for body in payloads:
        reference.export_traces(parse_trace_request(body, "protobuf"), "bench")
    _timed(cpu, collected, REFERENCE_DECODER, t)

    traces = _Collect()
    assembler = Assembler(traces, _ASSEMBLE_AT_SHUTDOWN, stats)
    ingest = OtlpIngest(assembler, NodeMetricsState(), IngestLimits(), stats)
    t = _start()
    for body in payloads:  # what the receivers run: the native decoder where built
        ingest.export_trace_payload(body, "protobuf", "bench")
    _timed(cpu, collected, "decode and buffer", t)
    t = _start()
    assembler.shutdown()
    _timed(cpu, collected, "assemble", t)

    records = _Collect()
    mapper = StageMapper(CallJoiner(records, JoinConfig(), stats), stats)
    t = _start()
    for trace in traces.traces:
        mapper.consume_trace(trace)
    mapper.shutdown()
    _timed(cpu, collected, "map and join", t)

    priced = _Collect()
    attributor = CostAttributor(priced, load_price_sheet(),
                                config=AttributorConfig(tick_seconds=0))
    t = _start()
    for record in records.records:
        attributor.consume_record(record)
    attributor.shutdown()
    _timed(cpu, collected, "price", t)

    sink = PrometheusSink(stats=stats)
    t = _start()
    for record in priced.records:
        sink.consume_record(record)
    for idle in priced.idle:
        sink.consume_idle_cost(idle)
    _timed(cpu, collected, "Prometheus sink", t)

    store = RecordStore(StoreConfig(path=str(store_dir / "stages.db"),
                                    batch_size=len(priced.records) + len(priced.idle) + 1,
                                    queue_size=len(priced.records) + len(priced.idle) + 1),
                        stats)
    batch: list[RequestRecord | IdleCost] = [*priced.records, *priced.idle]
    t = _start()
    store._write(batch)  # the writer thread's batch write, on this thread
    _timed(cpu, collected, "store", t)
    store.shutdown()

    n_traces = len(traces.traces)
    floor = cpu["floor (parse and read every field)"]
    pipeline = sum(v for k, v in cpu.items() if not k.startswith("floor")
                   and k != REFERENCE_DECODER)
    return {
        "spans": spans, "traces": n_traces, "records": len(priced.records),
        "spans_per_trace": spans / max(1, n_traces),
        "stages_us_per_span": {k: v / spans * 1e6 for k, v in cpu.items()},
        "stages_us_per_trace": {k: v / max(1, n_traces) * 1e6 for k, v in cpu.items()},
        "gc_us_per_trace": {k: v / max(1, n_traces) * 1e6 for k, v in collected.items()
                            if v},
        "pipeline_us_per_span": pipeline / spans * 1e6,
        "pipeline_ratio_to_floor": pipeline / floor if floor else None,
        "compiled_decoder": native_decoder_available(),
    }


def run(requests: int = 300, reference_requests: int = 1500,
        gc_young_threshold: int = DEFAULT_GC_YOUNG_THRESHOLD) -> dict[str, Any]:
    """Both shapes, with the garbage collector set as the collector process sets it
    (collector/gc_tuning.py; 0 keeps Python's default)."""
    tune_gc(gc_young_threshold)
    shapes = {SHAPE_STAGE_SPANS: make_requests(requests),
              SHAPE_REFERENCE_PATH: reference_path_requests(reference_requests)}
    with tempfile.TemporaryDirectory() as tmp:
        return {name: measure(payloads, Path(tmp)) for name, payloads in shapes.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--reference-requests", type=int, default=1500)
    parser.add_argument("--gc-young-threshold", type=int, default=DEFAULT_GC_YOUNG_THRESHOLD)
    args = parser.parse_args()
    print(json.dumps(run(args.requests, args.reference_requests, args.gc_young_threshold),
                     indent=2))


if __name__ == "__main__":
    main()
