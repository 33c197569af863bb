"""The few numbers and the one name a gateway reads from an OpenAI-style request and response.

Never content: from the request body only its top-level ``model`` (:func:`request_model`);
from the response only the numbers of its ``usage`` and of vLLM's per-request ``metrics``
object (:func:`response_attributes`), under GenAI names where they exist.

Cheap, since a gateway runs it on every request:

- the request body is scanned, not parsed: one regular expression walks its strings and
  brackets at C speed (a message's content is one string however long), and the walk stops
  at the top-level ``model``. Bodies over ``MAX_REQUEST_BYTES`` are not scanned.
- of the response only the tail is read (:class:`ResponseTail` keeps the last two body
  chunks, two reference stores a chunk): a JSON body ends with its ``usage`` (and
  ``metrics``), and a stream sends them in its last data chunk before ``[DONE]``. vLLM
  sends them in a stream only when the client asked (``stream_options.include_usage``)
  or the server runs ``--enable-force-include-usage``; nothing here changes a request.

Nothing here raises: a body that is not what is expected gives nothing.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Final

from tokenpath import attributes as attr

# Request bodies larger than this are not scanned for the model (the engine still names it).
MAX_REQUEST_BYTES: Final = 1 << 20
MAX_MODEL_CHARS: Final = 256
# How much of the response's end is read for usage and metrics.
MAX_TAIL_BYTES: Final = 64 * 1024
# A JSON string, its escapes included.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_OBJECT_START = re.compile(rb"\s*\{")
_COLON_AFTER = re.compile(rb"\s*:")
_KEY_VALUE = re.compile(rb'\s*:\s*"([^"\\]*(?:\\.[^"\\]*)*)"')
_BACKSLASH = ord("\\")
_MODEL_KEY = b'"model"'
_MAX_MODEL_KEYS = 8  # "model" keys looked at, nested ones included (a tool's schema)
_END_WINDOW = 4096  # bytes at each end of the body searched first
_USAGE_KEY = b'"usage"'
_METRICS_KEY = b'"metrics"'
# Occurrences of a key tried from the end (a stream's earlier ``"usage":null``).
_MAX_KEY_TRIES = 4
_DECODER = json.JSONDecoder()

# usage -> span attribute (token counts)
_USAGE_COUNTS: Final = (
    (("prompt_tokens",), attr.GEN_AI_USAGE_INPUT_TOKENS),
    (("completion_tokens",), attr.GEN_AI_USAGE_OUTPUT_TOKENS),
    (("prompt_tokens_details", "cached_tokens"), attr.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS),
    (("prompt_tokens_details", "created_cache_tokens"),
     attr.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS),
    (("completion_tokens_details", "reasoning_tokens"), attr.USAGE_REASONING_TOKENS),
)
# vLLM's per-request ``metrics`` (--enable-per-request-metrics): milliseconds -> seconds
# under the names of vLLM's own llm_request span, whose values they are (vLLM 0.32
# computes both from the same request timestamps: queued, scheduled, first and last token).
_METRIC_SECONDS: Final = (
    ("queue_time_ms", attr.VLLM_LATENCY_TIME_IN_QUEUE),
    ("time_to_first_token_ms", attr.VLLM_LATENCY_TIME_IN_MODEL_PREFILL),
    ("generation_time_ms", attr.VLLM_LATENCY_TIME_IN_MODEL_DECODE),
    ("mean_itl_ms", attr.VLLM_MEAN_ITL_SECONDS),
)
_METRIC_RATES: Final = (("tokens_per_second", attr.VLLM_TOKENS_PER_SECOND),)


def request_model(body: bytes) -> str | None:
    """The top-level ``model`` of a JSON request body, or None (not JSON, no such key, not
    a string, too long, or a body over MAX_REQUEST_BYTES).

    Exact for a valid JSON body, and cheap: each ``"model"`` key found (``bytes.find``) is
    top-level when the brackets outside strings on its shorter side (before or after it;
    the strings removed by one regular-expression pass) leave it one object deep. The
    body's last and first 4 KiB are searched first: the openai clients send ``model``
    after ``messages``, so a long prompt is neither searched nor read."""
    try:
        if len(body) > MAX_REQUEST_BYTES or _OBJECT_START.match(body) is None:
            return None
        # where clients put it: last (the openai clients), first (hand-written bodies)
        end = len(body)
        for at in (body.rfind(_MODEL_KEY, max(0, end - _END_WINDOW)),
                   body.find(_MODEL_KEY, 0, _END_WINDOW)):
            if at >= 0 and _is_top_level_key(body, at):
                return _model_value(body, at)
        at = body.find(_MODEL_KEY)  # anywhere: each "model" key in turn
        for _ in range(_MAX_MODEL_KEYS):
            if at < 0:
                return None
            if _is_top_level_key(body, at):
                return _model_value(body, at)
            at = body.find(_MODEL_KEY, at + 1)
        return None  # more "model" keys than are worth reading
    except Exception:
        return None


def _model_value(body: bytes, at: int) -> str | None:
    value = _KEY_VALUE.match(body, at + len(_MODEL_KEY))
    if value is None:
        return None  # a number, null, an object: not a model name
    name = json.loads(b'"' + value.group(1) + b'"')
    return name if isinstance(name, str) and 0 < len(name) <= MAX_MODEL_CHARS else None


def _is_top_level_key(body: bytes, at: int) -> bool:
    """Whether the ``"model"`` at ``at`` is a key (not escaped inside a string, a colon
    after it) of the body's top-level object."""
    escapes = 0
    while at - escapes > 0 and body[at - escapes - 1] == _BACKSLASH:
        escapes += 1
    if escapes % 2 or _COLON_AFTER.match(body, at + len(_MODEL_KEY)) is None:
        return False  # a quote inside a string, or the string "model" as a value
    if at <= len(body) - at:  # the brackets before it leave one open
        before = _STRING.sub(b"", body[:at])
        return (before.count(b"{") + before.count(b"[")
                - before.count(b"}") - before.count(b"]")) == 1
    after = _STRING.sub(b"", body[at:])  # the brackets after it close one more
    return (after.count(b"}") + after.count(b"]")
            - after.count(b"{") - after.count(b"[")) == 1


class ResponseTail:
    """The last two chunks of a response body: what :func:`response_attributes` reads."""

    __slots__ = ("last", "previous")

    def __init__(self) -> None:
        self.previous: bytes | None = None
        self.last: bytes | None = None

    def add(self, chunk: bytes) -> None:
        self.previous, self.last = self.last, chunk

    def tail(self) -> bytes:
        last = self.last
        if last is None:
            return b""
        if len(last) >= MAX_TAIL_BYTES or self.previous is None:
            return last[-MAX_TAIL_BYTES:]
        return self.previous[-(MAX_TAIL_BYTES - len(last)):] + last


def response_attributes(tail: bytes) -> dict[str, int | float]:
    """Span attributes from the end of a JSON response or an SSE stream: the ``usage``
    token counts and vLLM's per-request ``metrics`` (numbers only); {} when it has
    neither."""
    out: dict[str, int | float] = {}
    try:
        usage = _last_object(tail, _USAGE_KEY)
        if usage is not None:
            for path, key in _USAGE_COUNTS:
                count = _count(_at(usage, path))
                if count is not None:
                    out[key] = count
        metrics = _last_object(tail, _METRICS_KEY)
        if metrics is not None:
            for name, key in _METRIC_SECONDS:
                number = _number(metrics.get(name))
                if number is not None:
                    out[key] = number / 1000.0
            for name, key in _METRIC_RATES:
                number = _number(metrics.get(name))
                if number is not None:
                    out[key] = number
    except Exception:
        return {}
    return out


def _last_object(tail: bytes, key: bytes) -> dict[str, Any] | None:
    """The JSON object that is the value of the last ``key`` in ``tail`` (a key, not
    content: quotes inside a JSON string are escaped)."""
    end = len(tail)
    for _ in range(_MAX_KEY_TRIES):
        at = tail.rfind(key, 0, end)
        if at < 0:
            return None
        end = at
        rest = tail[at + len(key):at + len(key) + 64].lstrip()
        if not rest.startswith(b":"):
            continue
        value = rest[1:].lstrip()
        if not value.startswith(b"{"):
            continue  # "usage": null in a stream's earlier chunk
        start = tail.index(b"{", at + len(key))
        try:
            found, _ = _DECODER.raw_decode(tail[start:].decode("utf-8", "replace"))
        except ValueError:
            continue
        return found if isinstance(found, dict) else None
    return None


def _at(data: dict[str, Any], path: tuple[str, ...]) -> object:
    value: object = data
    for part in path:
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) and number >= 0 else None
