"""Drive the reference serving path as a user's client does: the instrumented OpenAI-style
client (its own spans through ``provider``), at most ``concurrency`` requests in flight.
Shared by the ground-truth tests of the reference path (single engines and disaggregated
pools)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import TracerProvider

from tokenpath.instrumentation.client import InstrumentedClient
from tokenpath.instrumentation.reference.tokenizer import ToyTokenizer


def drive_chat(base_url: str, provider: TracerProvider, requests: Sequence[Any], model: str,
               concurrency: int) -> None:
    """Send every workload request (``messages``, ``max_tokens``, ``stream``) and wait for
    all of them."""

    async def drive() -> None:
        client = InstrumentedClient(base_url, tracer_provider=provider,
                                    tokenize=ToyTokenizer().encode)
        gate = asyncio.Semaphore(concurrency)

        async def one(request: Any) -> None:
            async with gate:
                await client.chat_completion(request.messages, model, request.max_tokens,
                                             stream=request.stream)

        try:
            await asyncio.gather(*(one(r) for r in requests))
        finally:
            await client.aclose()

    asyncio.run(drive())
