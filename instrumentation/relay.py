"""Streams an upstream engine's response back through a gateway (used by the reference
gateway's upstream mode and the vLLM test gateway)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import httpx
from fastapi.responses import StreamingResponse

from tokenpath.instrumentation.llm_payload import ResponseTail
from tokenpath.instrumentation.safety import telemetry_errors

# Hop-by-hop and length/encoding headers: the relay re-frames and decodes the body.
DROPPED_RESPONSE_HEADERS = frozenset(
    {"content-length", "transfer-encoding", "connection", "content-encoding"}
)


def relay_response(response: httpx.Response,
                   on_end: Callable[[ResponseTail], None] | None = None) -> StreamingResponse:
    """A StreamingResponse that forwards ``response`` (opened with ``stream=True``) chunk by
    chunk, decoded, and closes it when the client is done. ``on_end`` gets the last chunks
    (:class:`~tokenpath.instrumentation.llm_payload.ResponseTail`) once the body ended,
    before the response's last message is sent; an error in it is counted, never raised."""
    kept = {k: v for k, v in response.headers.items()
            if k.lower() not in DROPPED_RESPONSE_HEADERS}

    async def body() -> AsyncIterator[bytes]:
        tail = ResponseTail() if on_end is not None else None
        try:
            async for chunk in response.aiter_bytes():
                if tail is not None:
                    tail.add(chunk)
                yield chunk
        finally:
            await response.aclose()
            if on_end is not None and tail is not None:
                try:
                    on_end(tail)
                except Exception as exc:
                    telemetry_errors.count("relay.on_end", exc)

    return StreamingResponse(body(), status_code=response.status_code, headers=kept)
