"""Run by the GenAI venv (scripts/genai_env.sh), not by pytest: an agent under
traceloop-sdk (OpenLLMetry), a ``@workflow`` of three LLM calls with a tool step between,
exporting to a tokenpath collector.

Usage: traceloop_workflow.py BASE_URL COLLECTOR_URL. Prints one JSON line per call (its
response id and usage) and a last line with the workflow's trace id."""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TRACELOOP_TRACE_CONTENT", "false")
os.environ.setdefault("TRACELOOP_TELEMETRY", "false")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # traceloop imports litellm

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from traceloop.sdk import Traceloop
from traceloop.sdk.decorators import task, workflow

TOOL_SECONDS = 0.3


def main() -> None:
    base_url, collector = sys.argv[1], sys.argv[2]
    Traceloop.init(app_name="tokenpath-agent", disable_batch=True, telemetry_enabled=False,
                   exporter=OTLPSpanExporter(endpoint=f"{collector}/v1/traces"))
    import openai

    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)

    @task(name="lookup_tool")
    def lookup_tool() -> str:
        time.sleep(TOOL_SECONDS)
        return "tool result"

    def call(question: str, max_tokens: int, stream: bool) -> dict[str, object]:
        messages = [{"role": "user", "content": question}]
        if stream:
            response_id, usage = "", None
            for chunk in client.chat.completions.create(
                    model="m", messages=messages, max_tokens=max_tokens, stream=True,
                    stream_options={"include_usage": True}):
                response_id = chunk.id
                usage = chunk.usage or usage
        else:
            response = client.chat.completions.create(model="m", messages=messages,
                                                      max_tokens=max_tokens)
            response_id, usage = response.id, response.usage
        assert usage is not None
        return {"id": response_id, "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens, "stream": stream}

    @workflow(name="agent_run")
    def agent_run() -> tuple[list[dict[str, object]], str]:
        trace_id = format(trace.get_current_span().get_span_context().trace_id, "032x")
        calls = [call("Plan the steps to find the costliest stage.", 6, False)]
        lookup_tool()
        calls.append(call("Summarise the tool result for the prefill stage and the "
                          "decode stage, with their costs.", 12, True))
        calls.append(call("Answer.", 20, False))
        return calls, trace_id

    calls, trace_id = agent_run()
    for c in calls:
        print(json.dumps(c), flush=True)
    print(json.dumps({"workflow_trace_id": trace_id}), flush=True)
    trace.get_tracer_provider().shutdown()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
