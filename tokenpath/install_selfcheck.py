"""The install check's child process (:mod:`tokenpath.install_check`): imports one built
part and exercises it on :mod:`tokenpath.sample_traffic`, then prints the passed line.
A crash, an exception or a wrong answer leaves the line out, and the parent process runs
that part as plain Python.

    python -m tokenpath.install_selfcheck core|decoder
"""

from __future__ import annotations

import sys
import time

from tokenpath.install_check import (
    COMPONENT_CORE,
    COMPONENT_DECODER,
    CORE_COMPILED,
    DECODER_NATIVE,
    PASSED_LINE,
    build_state,
)


def check_decoder(body: bytes) -> None:
    """The native decoder gives the reference decoder's spans, and refuses what the
    reference refuses."""
    from tokenpath.collector.limits import IngestLimits
    from tokenpath.collector.receivers import otlp_decode

    if build_state().decoder != DECODER_NATIVE:
        raise SystemExit("the native decoder is not in use in the check process")
    limits = IngestLimits()
    native = otlp_decode.decode_native(body, limits)
    reference = otlp_decode.decode_traces(otlp_decode.parse_trace_request(body, "protobuf"),
                                          limits)
    if native is None or native.spans != reference.spans:
        raise SystemExit("the native decoder's spans differ from the reference decoder's")
    for broken in (body[:-3], b"\x0a\xff\xff\xff\xff\x0f", b"\x0a\x03\x12\x01"):
        if otlp_decode.decode_native(broken, limits) is not None:
            raise SystemExit("the native decoder accepted a truncated payload")


def check_core(body: bytes, now: float) -> None:
    """The compiled core decodes, assembles, maps, prices and renders the sample."""
    from prometheus_client import CollectorRegistry

    from tokenpath.collector.assembler import Assembler, AssemblerConfig
    from tokenpath.collector.call_join import CallJoiner, JoinConfig
    from tokenpath.collector.cost.attributor import AttributorConfig, CostAttributor
    from tokenpath.collector.cost.prices import load_price_sheet
    from tokenpath.collector.limits import IngestLimits
    from tokenpath.collector.mapping import StageMapper
    from tokenpath.collector.node_metrics import NodeMetricsState
    from tokenpath.collector.prometheus_sink import PrometheusSink
    from tokenpath.collector.receivers.ingest import OtlpIngest
    from tokenpath.collector.stats import CollectorStats
    from tokenpath.compiled import COMPILED_MODULES, compiled_modules
    from tokenpath.metric_names import REQUESTS

    if build_state().core != CORE_COMPILED or compiled_modules() != list(COMPILED_MODULES):
        raise SystemExit("the compiled core is not in use in the check process")
    from tokenpath.collector.assembler import AssembledTrace
    from tokenpath.records import IdleCost, RequestRecord

    class Traces:
        def __init__(self) -> None:
            self.items: list[AssembledTrace] = []

        def consume_trace(self, trace: AssembledTrace) -> None:
            self.items.append(trace)

        def shutdown(self) -> None:
            pass

    class Records:
        def __init__(self) -> None:
            self.items: list[RequestRecord] = []

        def consume_record(self, record: RequestRecord) -> None:
            self.items.append(record)

        def consume_idle_cost(self, idle: IdleCost) -> None:
            pass

        def shutdown(self) -> None:
            pass

    stats = CollectorStats()
    traces, mapped, priced = Traces(), Records(), Records()
    held = AssemblerConfig(root_grace_seconds=3600, idle_timeout_seconds=3600)
    assembler = Assembler(traces, held, stats)
    ingest = OtlpIngest(assembler, NodeMetricsState(), IngestLimits(), stats)
    ingest.export_trace_payload(body, "protobuf", "install-check")
    assembler.shutdown()
    mapper = StageMapper(CallJoiner(mapped, JoinConfig(), stats), stats)
    for trace in traces.items:
        mapper.consume_trace(trace)
    mapper.shutdown()
    attributor = CostAttributor(priced, load_price_sheet(), clock=lambda: now,
                                config=AttributorConfig(tick_seconds=0))
    for record in mapped.items:
        attributor.consume_record(record)
    attributor.shutdown()
    sink = PrometheusSink(CollectorRegistry(), stats)
    for record in priced.items:
        sink.consume_record(record)
    text = sink.render()
    if not priced.items or REQUESTS.name not in text:
        raise SystemExit("the compiled core priced no record of the sample")


def main(argv: list[str]) -> None:
    from tokenpath.sample_traffic import sample_export

    component = argv[0] if argv else ""
    now = time.time()
    body = sample_export(now).SerializeToString()
    if component == COMPONENT_CORE:
        check_core(body, now)
    elif component == COMPONENT_DECODER:
        check_decoder(body)
    else:
        raise SystemExit(f"usage: python -m tokenpath.install_selfcheck "
                         f"{COMPONENT_CORE}|{COMPONENT_DECODER}")
    print(PASSED_LINE, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
