"""Drive a workload against an OpenAI-compatible endpoint at a target request rate."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tokenpath.instrumentation.client import ClientResult, InstrumentedClient
from tokenpath.instrumentation.reference.workload import WorkloadGenerator

DEFAULT_MAX_IN_FLIGHT = 256


@dataclass(slots=True)
class DriveStats:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    cancelled: int = 0  # stopped in flight (the run was interrupted); each is an error record
    output_chunks: int = 0
    in_flight: int = 0
    started: float = field(default_factory=time.monotonic)
    trace_ids: list[str] = field(default_factory=list)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started


async def drive(client: InstrumentedClient, workload: WorkloadGenerator, model: str,
                rps: float, duration: float | None = None, requests: int | None = None,
                on_progress: Callable[[DriveStats], None] | None = None,
                max_in_flight: int = DEFAULT_MAX_IN_FLIGHT, seed: int = 11,
                api_keys: Sequence[tuple[str, float]] = ()) -> DriveStats:
    """Send requests with Poisson arrivals at ``rps`` until ``duration`` seconds or
    ``requests`` requests (whichever comes first; neither: until cancelled), then wait
    for the ones in flight. ``api_keys``: (key, weight) pairs; each request is sent with
    one, drawn by weight (the tenants of a multi-tenant platform)."""
    stats = DriveStats()
    rng = random.Random(seed)
    tasks: set[asyncio.Task[None]] = set()
    gate = asyncio.Semaphore(max_in_flight)

    keys = [key for key, _ in api_keys]
    weights = [weight for _, weight in api_keys]
    key_rng = random.Random(seed + 1)  # its own stream: the arrivals stay as they were

    async def one() -> None:
        request = workload.next_request()
        key = key_rng.choices(keys, weights)[0] if keys else None
        stats.in_flight += 1
        try:
            result: ClientResult = await client.chat_completion(
                request.messages, model, request.max_tokens, stream=request.stream,
                api_key=key)
            if result.status_code == 200:
                stats.ok += 1
                stats.output_chunks += result.chunks
                if result.trace_id:
                    stats.trace_ids.append(result.trace_id)
            else:
                stats.failed += 1
        except asyncio.CancelledError:
            stats.cancelled += 1
            raise
        except Exception:
            stats.failed += 1
        finally:
            stats.in_flight -= 1
            gate.release()
            if on_progress is not None:
                on_progress(stats)

    try:
        while True:
            if duration is not None and stats.elapsed >= duration:
                break
            if requests is not None and stats.sent >= requests:
                break
            await gate.acquire()
            stats.sent += 1
            task = asyncio.create_task(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            await asyncio.sleep(rng.expovariate(rps) if rps > 0 else 0)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for task in tasks:
            task.cancel()
    return stats
