"""What a gateway reads from an OpenAI-style request and response: the top-level model name
and the numbers of ``usage`` and vLLM's per-request ``metrics``; never content."""

from __future__ import annotations

import json

import pytest

from tokenpath import attributes as A
from tokenpath.instrumentation.llm_payload import (
    MAX_REQUEST_BYTES,
    MAX_TAIL_BYTES,
    ResponseTail,
    request_model,
    response_attributes,
)

# vLLM 0.32's shapes (--enable-prompt-tokens-details --enable-per-request-metrics)
USAGE = {"prompt_tokens": 151, "total_tokens": 159, "completion_tokens": 8,
         "prompt_tokens_details": {"cached_tokens": 128}}
METRICS = {"time_to_first_token_ms": 12.5, "generation_time_ms": 80.0, "queue_time_ms": 0.5,
           "mean_itl_ms": 11.4, "tokens_per_second": 86.0}


def chat_body(**extra: object) -> bytes:
    body = {"messages": [{"role": "user", "content": 'say "model": "evil" {[ ]}'}],
            **extra}
    return json.dumps(body).encode()


@pytest.mark.parametrize(("body", "model"), [
    (chat_body(model="tiny-llama"), "tiny-llama"),
    (json.dumps({"model": "m", "messages": []}).encode(), "m"),
    (b'  {"messages":[],"model" :  "caf\\u00e9"}', "caf\u00e9"),
    # nested "model" keys are not the request's
    (chat_body(tools=[{"function": {"parameters": {"model": "x"}}}], model="top"), "top"),
    (chat_body(response_format={"model": "nested"}), None),
    (chat_body(model=7), None),
    (chat_body(model=None, user="u"), None),
    (chat_body(model={"name": "x"}), None),
    (chat_body(model="x" * 300), None),
    (b"[1, 2]", None),
    (b"not json", None),
    (b"", None),
    (b'{"messages": [', None),
])
def test_the_request_model_is_its_top_level_model_string(body: bytes,
                                                         model: str | None) -> None:
    assert request_model(body) == model


def test_the_top_level_model_is_found_wherever_it_is_and_nested_ones_are_not_it() -> None:
    pad = "p" * 10_000
    nested = {"function": {"parameters": {"model": "nested"}}}
    body = json.dumps({"tools": [nested], "a": pad, "model": "middle", "b": pad,
                       "tail": [nested, {"x": '\\"model\\": "escaped"'}]}).encode()
    assert request_model(body) == "middle"
    first = json.dumps({"model": "first", "messages": [{"content": pad * 50}]}).encode()
    assert request_model(first) == "first"
    last = json.dumps({"messages": [{"content": pad * 50}], "model": "last"}).encode()
    assert request_model(last) == "last"


def test_a_body_over_the_bound_is_not_scanned() -> None:
    big = chat_body(model="m", padding="x" * MAX_REQUEST_BYTES)
    assert request_model(big) is None


def test_a_json_response_gives_its_usage_and_metrics_numbers() -> None:
    body = json.dumps({"id": "chatcmpl-1", "choices": [{"message": {
        "content": 'text with "usage": {"prompt_tokens": 999}'}}], "usage": USAGE,
        "metrics": METRICS}).encode()
    out = response_attributes(body)
    assert out == {
        A.GEN_AI_USAGE_INPUT_TOKENS: 151, A.GEN_AI_USAGE_OUTPUT_TOKENS: 8,
        A.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: 128,
        A.VLLM_LATENCY_TIME_IN_MODEL_PREFILL: pytest.approx(0.0125),
        A.VLLM_LATENCY_TIME_IN_MODEL_DECODE: pytest.approx(0.08),
        A.VLLM_LATENCY_TIME_IN_QUEUE: pytest.approx(0.0005),
        A.VLLM_MEAN_ITL_SECONDS: pytest.approx(0.0114),
        A.VLLM_TOKENS_PER_SECOND: pytest.approx(86.0)}


def sse(*events: dict[str, object]) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + \
        b"data: [DONE]\n\n"


def test_a_stream_gives_them_from_its_final_usage_chunk_split_across_writes() -> None:
    stream = sse({"choices": [{"delta": {"content": "hi"}}], "usage": None},
                 {"choices": [], "usage": {**USAGE, "completion_tokens_details": {
                     "reasoning_tokens": 3}}, "metrics": METRICS})
    tail = ResponseTail()
    for at in range(0, len(stream), 40):
        tail.add(stream[at:at + 40])
    out = response_attributes(tail.tail())
    assert out == {}  # the last two writes of 40 bytes hold only part of it
    tail = ResponseTail()
    cut = stream.index(b'"usage": {')
    tail.add(stream[:cut])
    tail.add(stream[cut:])
    out = response_attributes(tail.tail())
    assert out[A.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 128
    assert out[A.USAGE_REASONING_TOKENS] == 3
    assert out[A.VLLM_LATENCY_TIME_IN_QUEUE] == pytest.approx(0.0005)


def test_a_stream_without_usage_gives_nothing() -> None:
    stream = sse({"choices": [{"delta": {"content": "hi"}}]})
    assert response_attributes(stream) == {}
    assert response_attributes(sse({"choices": [], "usage": None})) == {}


def test_garbled_values_are_left_out() -> None:
    body = json.dumps({"usage": {"prompt_tokens": -1, "completion_tokens": "8",
                                 "prompt_tokens_details": None},
                       "metrics": {"queue_time_ms": None, "mean_itl_ms": True,
                                   "generation_time_ms": float("inf")}}).encode()
    assert response_attributes(body) == {}
    assert response_attributes(b'{"usage": {"prompt_tokens": 5') == {}


def test_the_tail_is_bounded() -> None:
    tail = ResponseTail()
    tail.add(b"a" * MAX_TAIL_BYTES)
    tail.add(b"b" * 10)
    assert len(tail.tail()) == MAX_TAIL_BYTES and tail.tail().endswith(b"b" * 10)
    tail.add(b"c" * (2 * MAX_TAIL_BYTES))
    assert len(tail.tail()) == MAX_TAIL_BYTES
    assert ResponseTail().tail() == b""
