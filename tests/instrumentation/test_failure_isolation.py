"""Telemetry never breaks a request: broken exporters, processors, tracers, dead collectors."""

from __future__ import annotations

import socket
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.trace import ProxyTracerProvider

from testkit.fakes.otel_sink import RaisingExporter
from tests.instrumentation.reference.support import send, serving, workload_requests
from tokenpath.instrumentation.safety import telemetry_errors

REQUESTS = workload_requests(4, stream_share=0.5)


def _all_ok(provider: Any) -> list[str]:
    with serving(provider) as path:
        results = send(path, provider, REQUESTS)
    assert [r.status_code for r in results] == [200] * len(REQUESTS)
    assert all(r.text for r in results)
    return [r.text for r in results]


def test_a_raising_exporter_never_breaks_a_request() -> None:
    provider = TracerProvider(shutdown_on_exit=False)
    exporter = RaisingExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _all_ok(provider)
    assert exporter.calls > 0  # spans did reach the broken exporter


class ExplodingProcessor(SpanProcessor):
    def __init__(self) -> None:
        self.calls = 0

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.calls += 1
        if self.calls % 2:
            raise RuntimeError("processor broke on start")

    def on_end(self, span: Any) -> None:
        raise RuntimeError("processor broke on end")


def test_a_raising_span_processor_is_caught_and_counted() -> None:
    provider = TracerProvider(shutdown_on_exit=False)
    processor = ExplodingProcessor()
    provider.add_span_processor(processor)
    before = telemetry_errors.total()
    _all_ok(provider)
    assert processor.calls > 0
    assert telemetry_errors.total() > before


class BrokenTracerProvider(ProxyTracerProvider):
    def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
        class BrokenTracer:
            def start_span(self, *a: Any, **k: Any) -> Any:
                raise RuntimeError("tracer broke")

        return BrokenTracer()


def test_a_tracer_that_raises_leaves_requests_untouched() -> None:
    texts = _all_ok(BrokenTracerProvider())
    assert len(texts) == len(REQUESTS)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_dead_collector_endpoint_never_breaks_a_request() -> None:
    provider = TracerProvider(shutdown_on_exit=False)
    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{_closed_port()}/v1/traces",
                                timeout=1)
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=50))
    try:
        _all_ok(provider)
    finally:
        provider.shutdown()
