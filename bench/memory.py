"""Retained bytes per buffered span (tracemalloc) in the assembler."""

from __future__ import annotations

import gc
import json
import tracemalloc
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bench.payloads import SPANS_PER_REQUEST, make_requests
from tokenpath.collector.assembler import AssembledTrace, Assembler, AssemblerConfig
from tokenpath.collector.limits import IngestLimits
from tokenpath.collector.receivers.otlp_decode import decode_traces


class _Discard:
    def consume_trace(self, trace: AssembledTrace) -> None:
        del trace

    def shutdown(self) -> None:
        pass


def run(requests: int = 200) -> dict[str, Any]:
    payloads = make_requests(requests)
    messages = []
    for body in payloads:
        m = ExportTraceServiceRequest()
        m.ParseFromString(body)
        messages.append(m)
    limits = IngestLimits()
    config = AssemblerConfig(root_grace_seconds=3600, idle_timeout_seconds=3600,
                             max_traces=1_000_000)
    assembler = Assembler(_Discard(), config)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for m in messages:
        assembler.consume_spans(decode_traces(m, limits).spans)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    spans = requests * SPANS_PER_REQUEST
    return {"spans_buffered": spans, "bytes_per_buffered_span": (after - before) / spans}


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
