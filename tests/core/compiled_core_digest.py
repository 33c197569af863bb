"""Prices a fixed set of traces through the collector's components in this process and
prints what they produce, for ``test_compiled_core``: run once with the compiled core and
once with ``TOKENPATH_PURE_PYTHON=1``, the two outputs must be equal byte for byte.

The traffic exercises the hard path: overlapping continuous-batching timelines of three
engines at real batch sizes (tests/deploy/engine_traffic.py: vLLM's own spans known only
by their resource, half under a gateway span, and the demo engine's hooks), a burst of
requests all in flight on one engine, and 15-stage traces of separate spans
(bench/payloads.py). The payloads are made once (:func:`write_payloads`) and read by
both runs, and everything runs on a fixed clock, so the output depends on the code alone.

    python -m tests.core.compiled_core_digest PAYLOADS_FILE
"""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

from bench.payloads import make_requests
from tests.deploy.engine_traffic import burst_traffic, engine_traffic
from tokenpath import compiled
from tokenpath.collector.assembler import AssembledTrace, Assembler, AssemblerConfig
from tokenpath.collector.call_join import CallJoiner, JoinConfig
from tokenpath.collector.cost.attributor import AttributorConfig, CostAttributor
from tokenpath.collector.cost.prices import load_price_sheet
from tokenpath.collector.limits import IngestLimits
from tokenpath.collector.mapping import StageMapper
from tokenpath.collector.node_metrics import NodeMetricsState
from tokenpath.collector.prometheus_sink import PrometheusSink
from tokenpath.collector.receivers.ingest import OtlpIngest
from tokenpath.collector.stats import CollectorStats
from tokenpath.records import IdleCost, RequestRecord

NOW = 1_790_000_000.0  # the fixed clock: every timeline ends just before it
_HELD = AssemblerConfig(root_grace_seconds=3600, idle_timeout_seconds=3600,
                        max_traces=10**6)


class _Collect:
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


def write_payloads(path: Path) -> None:
    """The OTLP export requests both runs price."""
    payloads = [engine_traffic(NOW, per_engine=150).request.SerializeToString(),
                burst_traffic(NOW, 400).SerializeToString(),
                *make_requests(20)]
    path.write_bytes(pickle.dumps(payloads))


def digest(payloads: list[bytes]) -> dict[str, object]:
    stats = CollectorStats()
    traces = _Collect()
    assembler = Assembler(traces, _HELD, stats)
    ingest = OtlpIngest(assembler, NodeMetricsState(), IngestLimits(), stats)
    for body in payloads:
        ingest.export_trace_payload(body, "protobuf", "digest")
    assembler.shutdown()  # flushes every trace, in arrival order

    mapped = _Collect()
    mapper = StageMapper(CallJoiner(mapped, JoinConfig(), stats), stats)
    for trace in traces.traces:
        mapper.consume_trace(trace)
    mapper.shutdown()

    priced = _Collect()
    attributor = CostAttributor(priced, load_price_sheet(), clock=lambda: NOW,
                                config=AttributorConfig(tick_seconds=0))
    for record in mapped.records:
        attributor.consume_record(record)
    attributor.shutdown()

    sink = PrometheusSink(stats=stats)
    for record in priced.records:
        sink.consume_record(record)
    for idle in priced.idle:
        sink.consume_idle_cost(idle)
    return {
        "core": compiled.describe(),
        "records": sorted((r.to_json() for r in priced.records),
                          key=lambda r: (str(r["trace_id"]), str(r.get("record_id")))),
        "idle": [repr(idle) for idle in priced.idle],
        "exposition": sink.render(),
    }


def main() -> None:
    payloads = pickle.loads(Path(sys.argv[1]).read_bytes())
    json.dump(digest(payloads), sys.stdout, sort_keys=True, default=repr)


if __name__ == "__main__":
    main()
