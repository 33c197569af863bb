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

import json
import sys

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
    import openai

    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    for i in range(int(n)):
        messages = [{"role": "user",
                     "content": f"{marker} question {i}: " + "why is that so " * (2 * i + 1)}]
        common = {"model": model, "messages": messages, "max_tokens": 3 + i,
                  "extra_body": {"ignore_eos": True}}
        if i % 2:
            stream = client.chat.completions.create(
                **common, stream=True, stream_options={"include_usage": True})
            response_id, usage = "", None
            for chunk in stream:
                response_id = chunk.id
                usage = chunk.usage or usage
        else:
            response = client.chat.completions.create(**common)
            response_id, usage = response.id, response.usage
        assert usage is not None
        details = getattr(usage, "prompt_tokens_details", None)
        print(json.dumps({"id": response_id, "prompt_tokens": usage.prompt_tokens,
                          "completion_tokens": usage.completion_tokens,
                          "cached_tokens": getattr(details, "cached_tokens", None),
                          "stream": bool(i % 2)}), flush=True)
    provider.shutdown()  # flushes


if __name__ == "__main__":
    main()
