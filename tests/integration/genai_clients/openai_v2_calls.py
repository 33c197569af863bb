"""Run by the GenAI venv (scripts/genai_env.sh), not by pytest: the openai client under
opentelemetry-instrumentation-openai-v2, exporting its spans to a tokenpath collector.

Usage: openai_v2_calls.py BASE_URL COLLECTOR_URL N. Prints one JSON line per call: the
response id and the usage the server returned. Odd calls stream. The openai client's
httpx2 transport is not instrumented, so no traceparent reaches the server: each call is
a trace of its own on each side (what tokenpath joins by response id)."""

from __future__ import annotations

import json
import sys

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor


def main() -> None:
    base_url, collector, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    provider = TracerProvider(resource=Resource.create({"service.name": "openai-v2-client"}))
    provider.add_span_processor(BatchSpanProcessor(
        OTLPSpanExporter(endpoint=f"{collector}/v1/traces"), schedule_delay_millis=200))
    trace.set_tracer_provider(provider)
    OpenAIInstrumentor().instrument(tracer_provider=provider)
    import openai

    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "Which stage costs the most?"}]
    for i in range(n):
        if i % 2:
            stream = client.chat.completions.create(
                model="m", messages=messages, max_tokens=8, stream=True,
                stream_options={"include_usage": True})
            response_id, usage = "", None
            for chunk in stream:
                response_id = chunk.id
                usage = chunk.usage or usage
        else:
            response = client.chat.completions.create(model="m", messages=messages,
                                                      max_tokens=8)
            response_id, usage = response.id, response.usage
        assert usage is not None
        print(json.dumps({"id": response_id, "prompt_tokens": usage.prompt_tokens,
                          "completion_tokens": usage.completion_tokens,
                          "stream": bool(i % 2)}), flush=True)
    provider.shutdown()  # flushes


if __name__ == "__main__":
    main()
