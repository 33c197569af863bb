"""The multi-collector setup of the deployment tests (test_scale_out.py,
test_shared_clickhouse.py): three `tokenpath collector` replicas forwarding their mapped
records (--forward-records) behind the load-balancing router (router.py), a lone collector
beside them on the same traffic, and the helpers that read them as a user would: their
/metrics, `tokenpath report --format json`."""

from __future__ import annotations

import json
import math
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
# SLO classes every collector runs (classified where traces are mapped, so alike on every
# replica): requests through the gateway held to a TTFT the engine traffic meets about
# half the time, the rest to loose targets.
SLO_CLASSES: list[dict[str, object]] = [
    {"name": "chat", "match": {"attribute": {"http.route": "/v1/chat/completions"}},
     "ttft_seconds": 3.0, "objective": 0.99},
    {"name": "batch", "ttft_seconds": 8.0, "e2e_seconds": 120.0, "objective": 0.9},
]
PRICING: dict[str, object] = {"slo_classes": SLO_CLASSES}
# The report's SLO figures that must not depend on how the collectors are laid out.
SLO_COUNTS = ("requests", "met", "missed", "unknown", "gpus_billed")
SLO_FIGURES = ("cost_dollars", "missed_dollars", "goodput_requests_per_second",
               "goodput_per_gpu", "dollars_per_good_request")


def samples(http_url: str) -> dict[str, float]:
    """A collector's /metrics, each series summed over its labels."""
    with urllib.request.urlopen(f"{http_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def assert_same_slo(a: dict[str, Any], b: dict[str, Any], rel: float) -> None:
    """Two reports' SLO summaries (``report["slo"]``) agree: counts exactly, figures to
    ``rel``, class by class."""
    assert a is not None and b is not None
    for mine, theirs in ((a, b), *zip(a["classes"], b["classes"], strict=True)):
        assert mine.get("slo") == theirs.get("slo")
        for key in SLO_COUNTS:
            if key in theirs:
                assert mine[key] == theirs[key], key
        for key in SLO_FIGURES:
            assert (mine[key] is None) == (theirs[key] is None), key
            if theirs[key] is not None:
                assert math.isclose(mine[key], theirs[key], rel_tol=rel), key


def slo_digests(http_url: str) -> set[str]:
    """The digests of the SLO classes a collector runs (tokenpath_slo_config_info)."""
    with urllib.request.urlopen(f"{http_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {sample.labels[mn.LABEL_DIGEST]
            for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == mn.SLO_CONFIG_INFO.name}


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
