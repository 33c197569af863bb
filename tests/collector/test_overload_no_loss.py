"""A 200 means the record reaches the store: a collector process flooded with vLLM-shaped
traffic by clients that honour 429 + Retry-After stores every request, drops none.

The store is made the bottleneck (a write queue of a few dozen records, one record per
transaction), so the pipeline worker waits on it and the receivers answer 429: the test
asserts that happened, so it cannot pass without exercising back-pressure.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from bench.no_loss import clients_for
from testkit.support.otlp import metric_samples
from testkit.support.processes import FAST_CONFIG, start_collector
from tokenpath import metric_names as M

pytestmark = pytest.mark.integration

REQUESTS = 30_000
PER_EXPORT = 50  # gateway + vLLM span pairs per export request
CLIENTS = 4
# Small store queue, one record per transaction: the store is slower than the pipeline.
CONFIG = FAST_CONFIG + "store_queue_size: 64\nstore_batch_size: 1\n"
DEADLINE_SECONDS = 300  # a hang, not a speed check: the test waits for conditions


def _stored(store: Path) -> int:
    try:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=5) as db:
            (n,) = db.execute("SELECT COUNT(*) FROM records").fetchone()
    except sqlite3.Error:
        return 0  # not created yet, or busy for a moment
    return int(n)


def _dropped_in(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> float:
    return sum(v for (name, _), v in samples.items() if name == M.RECORDS_DROPPED.series)


def _dropped(url: str) -> float:
    return _dropped_in(metric_samples(httpx.get(f"{url}/metrics", timeout=10).text))


def _wait(predicate: object, what: str, deadline: float) -> None:
    assert callable(predicate)
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_every_accepted_request_reaches_the_store_under_overload(tmp_path: Path) -> None:
    store = tmp_path / "store.db"
    config = tmp_path / "collector.yaml"
    config.write_text(CONFIG)
    collector = start_collector(store, "--config", str(config))
    deadline = time.monotonic() + DEADLINE_SECONDS
    try:
        clients = clients_for(collector.http_url, REQUESTS, CLIENTS, PER_EXPORT)
        for client in clients:
            client.start()
        for client in clients:
            client.join(max(0.0, deadline - time.monotonic()))
            assert not client.is_alive(), "a client did not finish"
            assert client.error is None, client.error
        assert sum(c.accepted for c in clients) == REQUESTS
        # every record accounted for: stored, or (a failure) counted as dropped
        _wait(lambda: _stored(store) + _dropped(collector.http_url) >= REQUESTS,
              f"{REQUESTS} records stored or dropped", deadline)
        metrics = httpx.get(f"{collector.http_url}/metrics", timeout=10).text
    finally:
        output = collector.stop()
    samples = metric_samples(metrics)
    dropped = _dropped_in(samples)
    assert dropped == 0, output[-4000:]
    assert _stored(store) == REQUESTS
    assert "record dropped" not in output and "records dropped" not in output
    # The store really was the bottleneck: the receivers shed load at least once.
    assert sum(c.refused for c in clients) > 0
    refused = sum(v for (name, labels), v in samples.items()
                  if name == M.REQUESTS_REJECTED.series and ("status", "429") in labels)
    assert refused == sum(c.refused for c in clients)
