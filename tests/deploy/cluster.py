"""The multi-collector setup of the deployment tests (test_scale_out.py,
test_shared_clickhouse.py): three `tokenpath collector` replicas forwarding their mapped
records (--forward-records) behind the load-balancing router (router.py), a lone collector
beside them on the same traffic, and the helpers that read them as a user would: their
/metrics, `tokenpath report --format json`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.dashboards.otlp_workload import CollectorProcess
from tests.deploy.router import LoadBalancingRouter
from tokenpath import metric_names as mn

SHARDS = 3
SETTLE_TIMEOUT_SECONDS = 400.0  # a hang, not a speed check: the tests wait for conditions
# The collectors' own pricing settings: one replica forwarding a unit's records well after
# another (20 s was seen on 2 busy cores) is waited for by its progress (docs/deploy.md).
PRICING: dict[str, object] = {}


def samples(http_url: str) -> dict[str, float]:
    """A collector's /metrics, each series summed over its labels."""
    with urllib.request.urlopen(f"{http_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def report(*args: str) -> dict[str, Any]:
    """`tokenpath report ARGS --format json` (``--collector URL[,URL...]`` or ``--store
    PATH|URL``), as a user runs it."""
    done = subprocess.run([sys.executable, "-m", "tokenpath.cli.main", "report", *args,
                           "--format", "json"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return dict(json.loads(done.stdout))


def post(url: str, body: bytes) -> None:
    request = urllib.request.Request(url, data=body,
                                     headers={"Content-Type": "application/x-protobuf"})
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200


@dataclass
class Cluster:
    single: CollectorProcess
    shards: list[CollectorProcess]
    router: LoadBalancingRouter

    @property
    def processes(self) -> tuple[CollectorProcess, ...]:
        return (self.single, *self.shards)

    def wait_priced(self, total: int) -> None:
        """Until the lone collector and the replicas together have priced ``total``
        requests (tokenpath_requests_total)."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_SECONDS
        requests = mn.REQUESTS.series
        while time.monotonic() < deadline:
            if (samples(self.single.http_url).get(requests) == total
                    and sum(samples(s.http_url).get(requests, 0.0)
                            for s in self.shards) == total):
                return
            time.sleep(0.5)
        raise AssertionError(f"not all of {total} requests were priced in "
                             f"{SETTLE_TIMEOUT_SECONDS:.0f} s")


@contextmanager
def cluster(tmp_path: Path, shard_store: str | None = None,
            settings: dict[str, object] | None = None) -> Iterator[Cluster]:
    """The lone collector (its own SQLite store) and the replicas behind the router, each
    replica's store ``shard_store`` (one store for all) or its own SQLite file; every
    collector's config ``settings`` (:data:`PRICING` by default)."""
    settings = PRICING if settings is None else settings
    single = CollectorProcess(tmp_path, "single", settings=settings)
    shards = [CollectorProcess(tmp_path, f"replica-{i}", settings=settings, store=shard_store,
                               start=False) for i in range(SHARDS)]
    router = LoadBalancingRouter([s.http_url for s in shards])
    router.start()
    try:
        for index, shard in enumerate(shards):
            shard.start(("--forward-records", router.forward_url(index)))
        for process in (single, *shards):
            process.wait_ready()
        yield Cluster(single, shards, router)
    finally:
        for process in (single, *shards):
            process.stop()
        router.stop()
