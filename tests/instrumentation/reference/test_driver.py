"""The workload driver counts every request it sent, interrupted ones too."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from tokenpath.instrumentation.client import ClientResult
from tokenpath.instrumentation.reference.driver import DriveStats, drive
from tokenpath.instrumentation.reference.workload import WorkloadGenerator


class _SlowClient:
    """Answers every other request at once; the rest never finish."""

    def __init__(self) -> None:
        self.calls = 0

    async def chat_completion(self, *args: Any, **kwargs: Any) -> ClientResult:
        self.calls += 1
        if self.calls % 2:
            return ClientResult(200, "ok", 1, None)
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


def test_requests_in_flight_when_the_run_is_cancelled_are_counted_as_cancelled() -> None:
    seen: list[DriveStats] = []

    async def run() -> DriveStats:
        task = asyncio.create_task(drive(_SlowClient(), WorkloadGenerator(), "m",  # type: ignore[arg-type]
                                         rps=0, requests=6, on_progress=seen.append))
        while not seen or seen[-1].ok < 3:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return seen[-1]

    stats = asyncio.run(run())
    assert stats.sent == 6
    assert (stats.ok, stats.failed, stats.cancelled, stats.in_flight) == (3, 0, 3, 0)
