"""The OTLP fast path (collector/receivers/http.py OtlpFastPath): a POST to an OTLP path
is answered by its endpoint without entering the web app; every other request reaches
the app unchanged."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from starlette.responses import PlainTextResponse
from starlette.types import Receive, Scope, Send

from testkit.support.otlp import PROTOBUF_HEADERS, export_request, make_span, new_trace_id
from tokenpath.collector.limits import IngestLimits
from tokenpath.collector.node_metrics import NodeMetricsState
from tokenpath.collector.receivers.http import OtlpFastPath, otlp_endpoints
from tokenpath.collector.receivers.ingest import OtlpIngest
from tokenpath.collector.spans import SpanData
from tokenpath.collector.stats import CollectorStats

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


class _Spans:
    def __init__(self) -> None:
        self.spans: list[SpanData] = []

    def consume_spans(self, spans: list[SpanData]) -> Mapping[str, int]:
        self.spans.extend(spans)
        return {}


def test_otlp_posts_are_answered_without_the_app_and_the_rest_reach_it() -> None:
    from starlette.testclient import TestClient  # deprecated with httpx: warns on import

    reached: list[tuple[str, str]] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        reached.append((scope["method"], scope["path"]))
        await PlainTextResponse("from the app")(scope, receive, send)

    sink = _Spans()
    stats = CollectorStats()
    ingest = OtlpIngest(sink, NodeMetricsState(), IngestLimits(), stats)
    client = TestClient(OtlpFastPath(app, otlp_endpoints(ingest, stats)))
    body = export_request([make_span(new_trace_id(), name="gateway")]).SerializeToString()

    answer = client.post("/v1/traces", content=body, headers=PROTOBUF_HEADERS)
    assert answer.status_code == 200
    ExportTraceServiceResponse.FromString(answer.content)
    assert [s.name for s in sink.spans] == ["gateway"] and reached == []

    assert client.post("/v1/traces", content=b"x", headers={"Content-Type": "text/plain"}
                       ).status_code == 415  # the endpoint's own refusal, still no app
    assert reached == []
    for method, path in (("GET", "/v1/traces"), ("POST", "/v1/traces/"), ("POST", "/api/x")):
        assert client.request(method, path).text == "from the app"
    assert reached == [("GET", "/v1/traces"), ("POST", "/v1/traces/"), ("POST", "/api/x")]
