"""In-process collectors on free loopback ports for the reliability and security tests."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tokenpath.collector.assembler import AssemblerConfig
from tokenpath.collector.config import CollectorConfig
from tokenpath.collector.cost.attributor import AttributorConfig
from tokenpath.collector.service import CollectorService

FAST_ASSEMBLER = AssemblerConfig(root_grace_seconds=0.0, idle_timeout_seconds=5.0,
                                 tick_seconds=0.02)

# Price records as soon as they arrive (the default holds them for the arrival lag).
FAST_COST = AttributorConfig(min_delay_seconds=0.0, max_delay_seconds=0.0, tick_seconds=0.02)

ServiceFactory = Callable[..., CollectorService]


@pytest.fixture
def make_service() -> Iterator[ServiceFactory]:
    """Start CollectorService instances (ports 0, in-memory store unless given); all are
    shut down at the end of the test."""
    started: list[CollectorService] = []

    def factory(**overrides: Any) -> CollectorService:
        fields: dict[str, Any] = {"http_port": 0, "grpc_port": 0, "store_path": ":memory:",
                                  "assembler": FAST_ASSEMBLER, "cost": FAST_COST}
        fields.update(overrides)
        service = CollectorService(CollectorConfig(**fields))
        started.append(service)
        service.start()
        return service

    yield factory
    for service in started:
        service.shutdown()


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)
