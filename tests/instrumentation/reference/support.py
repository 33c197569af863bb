"""Run the reference path on loopback, time-scaled, and send requests through the client."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.trace import TracerProvider

from tokenpath.instrumentation.client import ClientResult, InstrumentedClient
from tokenpath.instrumentation.reference.engine import EngineConfig
from tokenpath.instrumentation.reference.ground_truth import GroundTruthWriter
from tokenpath.instrumentation.reference.serving_path import (
    ReferencePathConfig,
    ReferenceServingPath,
)
from tokenpath.instrumentation.reference.tokenizer import ToyTokenizer
from tokenpath.instrumentation.reference.workload import WorkloadConfig, WorkloadGenerator

FAST_TIME_SCALE = 0.002
MODEL = "llama-3.1-8b"


def fast_config(**overrides: Any) -> ReferencePathConfig:
    engine = EngineConfig(time_scale=FAST_TIME_SCALE, model=MODEL)
    config = ReferencePathConfig(engine=engine)
    return dataclasses.replace(config, **overrides)


@contextmanager
def serving(provider: TracerProvider | None, config: ReferencePathConfig | None = None,
            ground_truth: GroundTruthWriter | None = None) -> Iterator[ReferenceServingPath]:
    path = ReferenceServingPath(config or fast_config(), tracer_provider=provider,
                                ground_truth=ground_truth)
    path.start()
    try:
        yield path
    finally:
        path.shutdown()


def send(path: ReferenceServingPath, provider: TracerProvider | None,
         requests: list[dict[str, Any]], api_key: str | None = None,
         concurrency: int = 4) -> list[ClientResult]:
    """Each request dict: messages or prompt, max_tokens, stream."""

    async def run() -> list[ClientResult]:
        client = InstrumentedClient(path.base_url, api_key=api_key, tracer_provider=provider,
                                    tokenize=ToyTokenizer().encode)
        gate = asyncio.Semaphore(concurrency)

        async def one(request: dict[str, Any]) -> ClientResult:
            async with gate:
                if "prompt" in request:
                    return await client.completion(request["prompt"], MODEL,
                                                   request.get("max_tokens", 8),
                                                   stream=request.get("stream", True))
                return await client.chat_completion(request["messages"], MODEL,
                                                    request.get("max_tokens", 8),
                                                    stream=request.get("stream", True))

        try:
            return await asyncio.gather(*(one(r) for r in requests))
        finally:
            await client.aclose()

    return asyncio.run(run())


def workload_requests(count: int, **config: Any) -> list[dict[str, Any]]:
    defaults: dict[str, Any] = {"system_prompt_words": 160, "tool_definition_words": 96,
                                "user_words": (8, 40), "max_tokens": (2, 6),
                                "long_context_share": 0.0}
    defaults.update(config)
    generator = WorkloadGenerator(WorkloadConfig(**defaults))
    out = []
    for _ in range(count):
        request = generator.next_request()
        out.append({"messages": request.messages, "max_tokens": request.max_tokens,
                    "stream": request.stream})
    return out
