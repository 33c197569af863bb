"""Run by the OpenLIT venv (scripts/client_env.sh openlit), not by pytest: the openai 2.x
client under OpenLIT 1.45, straight to a vLLM server, exporting its spans to a tokenpath
collector over OTLP/HTTP.

Usage: openlit_calls.py BASE_URL COLLECTOR_URL MODEL N MARKER PRICING_JSON. Prints one JSON
line per call as openinference_calls.py does. OpenLIT captures message content by default
(the collector must drop it); PRICING_JSON is a local file, so OpenLIT fetches no price
list from the network."""

from __future__ import annotations

import json
import sys

import openlit


def main() -> None:
    base_url, collector, model, n, marker, pricing = sys.argv[1:7]
    openlit.init(otlp_endpoint=collector, application_name="openlit-app",
                 environment="test", disable_metrics=True, disable_batch=True,
                 pricing_json=pricing)
    import openai

    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    for i in range(int(n)):
        messages = [{"role": "user",
                     "content": f"{marker} question {i}: " + "how come " * (2 * i + 1)}]
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


if __name__ == "__main__":
    main()
