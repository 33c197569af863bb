"""Streams an upstream engine's response back through a gateway (used by the reference
gateway's upstream mode and the vLLM test gateway)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
from fastapi.responses import StreamingResponse

# Hop-by-hop and length/encoding headers: the relay re-frames and decodes the body.
DROPPED_RESPONSE_HEADERS = frozenset(
    {"content-length", "transfer-encoding", "connection", "content-encoding"}
)


def relay_response(response: httpx.Response) -> StreamingResponse:
    """A StreamingResponse that forwards ``response`` (opened with ``stream=True``) chunk by
    chunk, decoded, and closes it when the client is done."""
    kept = {k: v for k, v in response.headers.items()
            if k.lower() not in DROPPED_RESPONSE_HEADERS}

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in response.aiter_bytes():
                yield chunk
        finally:
            await response.aclose()

    return StreamingResponse(body(), status_code=response.status_code, headers=kept)
