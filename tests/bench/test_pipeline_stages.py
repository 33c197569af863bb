"""The bench's payload shapes and its stage-by-stage pass run end to end (small sizes):
every trace of both shapes becomes a priced, stored record."""

from __future__ import annotations

from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bench.payloads import make_requests, reference_path_requests
from bench.pipeline_stages import measure
from tokenpath import attributes as A


def _spans(payloads: list[bytes]) -> list[object]:
    out = []
    for body in payloads:
        message = ExportTraceServiceRequest.FromString(body)
        out.extend(s for rs in message.resource_spans for ss in rs.scope_spans for s in ss.spans)
    return out


def test_the_stage_shape_has_fifteen_stage_spans_of_six_attributes() -> None:
    spans = _spans(make_requests(2))
    stage_spans = [s for s in spans if any(kv.key == A.STAGE for kv in s.attributes)]
    assert stage_spans and all(len(s.attributes) == 6 for s in stage_spans)


def test_both_shapes_go_through_every_stage(tmp_path: Path) -> None:
    for payloads in (make_requests(3), reference_path_requests(6)):
        result = measure(payloads, tmp_path)
        assert result["traces"] > 0 and result["records"] == result["traces"]
        assert set(result["stages_us_per_span"]) >= {"decode and buffer", "assemble",
                                                     "map and join", "price", "store"}
