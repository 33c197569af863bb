"""Run by the OpenInference venv (scripts/client_env.sh openinference), not by pytest: the
openai 3.x client under openinference-instrumentation-openai, straight to a vLLM server,
exporting its spans to a tokenpath collector over OTLP/HTTP.

Usage: openinference_calls.py BASE_URL COLLECTOR_URL MODEL N MARKER. Prints one JSON line
per call: the response id, the usage vLLM returned and whether it streamed. Odd calls
stream (with ``stream_options.include_usage``). Each call has its own prompt length and
output length (``ignore_eos``), and every prompt carries MARKER, which nothing may store.
openai 3.x sends through httpx2, which nothing instruments: no traceparent reaches vLLM,
and OpenInference's spans carry no response id (what the collector joins without one)."""

from __future__ import annotations

import sys

from chat_calls import make_calls
from openinference.instrumentation.openai import OpenAIInstrumentor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor


def main() -> None:
    base_url, collector, model, n, marker = sys.argv[1:6]
    provider = TracerProvider(resource=Resource.create({"service.name": "openinference-app"}))
    provider.add_span_processor(BatchSpanProcessor(
        OTLPSpanExporter(endpoint=f"{collector}/v1/traces"), schedule_delay_millis=200))
    OpenAIInstrumentor().instrument(tracer_provider=provider)
    make_calls(base_url, model, int(n), marker, "why is that so ")
    provider.shutdown()  # flushes


if __name__ == "__main__":
    main()
