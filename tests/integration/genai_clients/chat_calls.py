"""The chat calls the OpenInference and OpenLIT client scripts make against vLLM, each
under its own instrumentation: alternately a plain and a streamed call (with usage), one
JSON line per call on stdout with what vLLM returned (id and token counts).

Imported by the scripts beside it (each runs as ``python SCRIPT``, so this folder is on
its path), in the client package's own venv.
"""

from __future__ import annotations

import json
from typing import Any


def make_calls(base_url: str, model: str, n: int, marker: str, filler: str) -> None:
    import openai  # after the caller's instrumentation is set up

    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    for i in range(n):
        messages = [{"role": "user",
                     "content": f"{marker} question {i}: " + filler * (2 * i + 1)}]
        common: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": 3 + i,
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
