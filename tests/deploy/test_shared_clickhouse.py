"""One ClickHouse store for the whole cluster: the three forwarding replicas of the
scale-out test (tests/deploy/cluster.py) all write to one ClickHouse server
(``--store clickhouse://default@HOST:PORT/DB``, the password from
$TOKENPATH_CLICKHOUSE_PASSWORD), here testkit/fakes/clickhouse_http.py: ClickHouse's HTTP
interface over chDB, spoken to by the real clickhouse-connect client. `tokenpath report
--store clickhouse://...` then prices the traffic as a lone collector does, and every
replica answers for every request, whichever replica priced it. A server outage shorter
than the writer's retry time loses no record whose export was answered 200. Skipped when
chdb or clickhouse-connect cannot be imported."""

from __future__ import annotations

import math
import random
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("chdb")
pytest.importorskip("clickhouse_connect")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans

from testkit.fakes.clickhouse_http import ClickHouseHTTPServer
from tests.dashboards.otlp_workload import CollectorProcess, request_trace
from tests.deploy.cluster import SLO_CLASSES, assert_same_slo, cluster, post, report, samples
from tests.deploy.engine_traffic import engine_traffic
from tokenpath import metric_names as mn
from tokenpath.collector.store import clickhouse_client as chclient

pytestmark = pytest.mark.integration

PER_ENGINE = 30  # three engines: 90 requests
# The replicas price a unit once it was quiet for min_delay_seconds and its slices' end
# plus that delay passed (about twice the delay in all). cluster.PRICING's 45 s leaves room
# for one replica forwarding 20 s after another with 300 requests on 2 busy cores; with 90
# requests the forwarding is a third of that work.
SHARED_PRICING: dict[str, object] = {"cost": {"min_delay_seconds": 25},
                                     "slo_classes": SLO_CLASSES}
PASSWORD = "a-cluster-secret"
WAIT_SECONDS = 120.0  # a hang, not a speed check: the tests wait for conditions
# The outage, well inside the writer's retry time (ch.DEFAULT_WRITE_RETRY_SECONDS, 60 s):
# past that, a batch's records are dropped and counted (store_write_failed).
OUTAGE_SECONDS = 8.0
SEND_EVERY_SECONDS = 0.05
# A small store queue so the outage fills it and the receivers push back (429).
OUTAGE_SETTINGS: dict[str, object] = {"store_queue_size": 16, "store_batch_size": 4,
                                      "cost": {"min_delay_seconds": 0.5}}


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ClickHouseHTTPServer]:
    monkeypatch.setenv(chclient.ENV_PASSWORD, PASSWORD)  # the collectors and the CLI inherit it
    fake = ClickHouseHTTPServer(tmp_path / "clickhouse", password=PASSWORD).start()
    yield fake
    fake.shutdown()


def _url(server: ClickHouseHTTPServer, database: str) -> str:
    return f"clickhouse://default@127.0.0.1:{server.port}/{database}"


def _record_ids(server: ClickHouseHTTPServer, database: str) -> list[str]:
    """The ids of the records in the store (a request's record id is its trace id)."""
    if server.query(f"EXISTS TABLE {database}.records").strip() != "1":
        return []
    return server.query(f"SELECT record_id FROM {database}.records").split()


def _wait(what: str, condition: Any) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.3)
    raise AssertionError(f"waited {WAIT_SECONDS:.0f} s for {what}")


def test_three_replicas_share_one_clickhouse_store(server: ClickHouseHTTPServer,
                                                   tmp_path: Path) -> None:
    url = _url(server, "tokenpath")
    traffic = engine_traffic(time.time(), per_engine=PER_ENGINE)
    total = len(traffic.trace_ids)
    body = traffic.request.SerializeToString()
    with cluster(tmp_path, shard_store=url, settings=SHARED_PRICING) as running:
        post(f"{running.single.http_url}/v1/traces", body)
        post(f"{running.router.url}/v1/traces", body)
        running.wait_priced(total)
        assert all(samples(p.http_url).get(mn.RECORDS_LATE.series) == 0
                   for p in running.processes)
        _wait("the replicas' records in ClickHouse",
              lambda: len(_record_ids(server, "tokenpath")) >= total)
        stored = _record_ids(server, "tokenpath")
        assert sorted(stored) == sorted(traffic.trace_ids)  # each request once

        # a fourth process reads the one store; it prices as the lone collector did
        shared = report("--store", url)
        alone = report("--collector", running.single.http_url)
        assert shared["requests"] == alone["requests"] == total
        assert math.isclose(shared["cost_dollars"], alone["cost_dollars"], rel_tol=1e-9)
        assert shared["cost_dollars"] > 0
        # the SLO classes' goodput and dollars per good request, read from ClickHouse
        assert shared["slo"]["met"] + shared["slo"]["missed"] + shared["slo"]["unknown"] == total
        assert_same_slo(shared["slo"], alone["slo"], 1e-9)

        # every replica answers for all of them, not only the ones it priced
        priced_here = {shard.http_url: samples(shard.http_url).get(mn.REQUESTS.series, 0.0)
                       for shard in running.shards}
        assert sum(priced_here.values()) == total  # each its units (the ring's choice)
        for shard in running.shards:
            summary = httpx.get(f"{shard.http_url}/api/summary", timeout=30).json()
            assert summary["requests"] == total
            assert math.isclose(summary["cost_dollars"], alone["cost_dollars"], rel_tol=1e-9)

        # the UI of one replica shows a record another replica priced: its requests page
        # (/api/requests) lists it, its request page (/api/requests/{id}) opens it priced
        trace_id, pricer = next(iter(running.router.record_replica.items()))
        viewer = next(s for s in running.shards if s.http_url != pricer)
        page = httpx.get(f"{viewer.http_url}/", timeout=30)
        assert page.status_code == 200 and "<html" in page.text.lower()
        listed = httpx.get(f"{viewer.http_url}/api/requests", params={"limit": 200},
                           timeout=30).json()
        assert trace_id in {r["record_id"] for r in listed}
        shown = httpx.get(f"{viewer.http_url}/api/requests/{trace_id}", timeout=30).json()
        theirs = httpx.get(f"{running.single.http_url}/api/requests/{trace_id}",
                           timeout=30).json()
        assert shown["cost_dollars"] > 0
        assert math.isclose(shown["cost_dollars"], theirs["cost_dollars"], rel_tol=1e-9)


def _send_one(collector: CollectorProcess, rng: random.Random) -> tuple[str, int]:
    """One request's trace, sent once: its trace id and the collector's answer."""
    trace_id, spans = request_trace(rng, "llama-3-8b", time.time_ns() - 1_000_000_000)
    body = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        scope_spans=[ScopeSpans(spans=spans)])]).SerializeToString()
    request = urllib.request.Request(f"{collector.http_url}/v1/traces", data=body,
                                     headers={"Content-Type": "application/x-protobuf"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return trace_id.hex(), int(response.status)
    except urllib.error.HTTPError as exc:
        return trace_id.hex(), int(exc.code)


def test_an_outage_loses_no_accepted_record(server: ClickHouseHTTPServer,
                                            tmp_path: Path) -> None:
    collector = CollectorProcess(tmp_path, "writer", settings=OUTAGE_SETTINGS,
                                 store=_url(server, "outage"))
    rng = random.Random(7)
    answers: dict[str, int] = {}
    try:
        collector.wait_ready()
        for _ in range(10):
            trace_id, status = _send_one(collector, rng)
            answers[trace_id] = status
        _wait("the first records", lambda: len(_record_ids(server, "outage")) == 10)

        server.pause()
        during: dict[str, int] = {}
        end = time.monotonic() + OUTAGE_SECONDS
        while time.monotonic() < end:
            trace_id, status = _send_one(collector, rng)
            during[trace_id] = status
            time.sleep(SEND_EVERY_SECONDS)
        server.resume()
        answers.update(during)
        for _ in range(10):
            trace_id, status = _send_one(collector, rng)
            answers[trace_id] = status

        assert set(answers.values()) <= {200, 429, 503}
        accepted = sorted(t for t, status in answers.items() if status == 200)
        # the outage was met: exports were accepted while the server was down, and the
        # receivers pushed back once the store's queue filled
        assert sum(status == 200 for status in during.values()) >= 10
        assert any(status in (429, 503) for status in during.values())
        _wait("every accepted record in ClickHouse",
              lambda: len(_record_ids(server, "outage")) >= len(accepted))
        assert sorted(_record_ids(server, "outage")) == accepted  # each once, none lost
        metrics = samples(collector.http_url)
        assert metrics.get(mn.RECORDS_DROPPED.series, 0.0) == 0
        assert metrics.get(mn.STORE_ERRORS.series, 0.0) == 0
        assert metrics.get(mn.RECORDS_STORED.series) == len(accepted)
    finally:
        collector.stop()
    assert "store: insert into records failed" in collector.log.read_text(errors="replace")
