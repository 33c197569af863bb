"""The views over running collectors (tokenpath/cli/remote.py on ``GET /api/aggregate``)
against the same views over the store file: the same 20,000 records answer report,
chargeback and leaks alike (counts equal, dollars to 1e-9, percentiles within the
histograms' bound) from the file, from one collector, from three replicas each holding a
third, from three replicas sharing one ClickHouse store (testkit/fakes/clickhouse_http.py:
ClickHouse's HTTP interface over chDB, spoken to by clickhouse-connect), and from a fresh
process reading ``chdb:///PATH``; a collector heard twice for one store counts once; and
what ``--collector`` fetches for 100,000 records stays within 2x of what it fetches for
1,000."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("chdb")
pytest.importorskip("clickhouse_connect")

from bench.store_workload import synthetic_records
from testkit.fakes.clickhouse_http import ClickHouseHTTPServer
from tests.collector.conftest import FAST_ASSEMBLER, FAST_COST
from tests.core.test_views import QUANTILE_KEYS, close, write
from tokenpath import views
from tokenpath.cli.remote import RemoteError, RemoteQueries
from tokenpath.collector.config import CollectorConfig
from tokenpath.collector.cost.chargeback import IdlePolicy
from tokenpath.collector.service import CollectorService
from tokenpath.collector.store import RecordStore, StoreConfig, make_store, open_store_readonly
from tokenpath.collector.store.url import ENV_PASSWORD
from tokenpath.query import Window
from tokenpath.records import IdleCost

RECORDS = 20_000
BYTES_RECORDS = 100_000
SEED = 5
PASSWORD = "a-cluster-secret"
CLI_TIMEOUT_SECONDS = 600  # a hang, not a speed check
SPAN_SECONDS = 6 * 3600.0
NETWORK_DOLLARS_PER_BYTE = 0.09e-9
QUANTILES = frozenset(QUANTILE_KEYS)


def _idle(now: float, hours: range) -> list[IdleCost]:
    return [IdleCost("pool-a", now - (hour + 1) * 3600, now - hour * 3600, 0.5 + hour,
                     1000.0 * hour) for hour in hours]


def _fill(path: Path, records: list[Any], idle: list[IdleCost]) -> None:
    store = RecordStore(StoreConfig(path=str(path)))
    try:
        write(store, records)
        store._write(list(idle))
    finally:
        store.shutdown()


def fill_clickhouse(url: str, end: float, now: float) -> None:
    """The 20,000 records and six hours of idle, written through the ClickHouse store's
    own writer (its batching sender) to ``url``. Run in a process of its own for
    ``chdb://`` (one chDB folder a process)."""
    store = make_store(StoreConfig(path=url))
    store.start()
    try:
        for record in synthetic_records(RECORDS, end, span_seconds=SPAN_SECONDS, seed=SEED):
            store.consume_record(record)
        for idle in _idle(now, range(6)):
            store.consume_idle_cost(idle)
        assert store.flush(), "the ClickHouse store's writer stopped"
    finally:
        store.shutdown()


def views_of(path: str, since: float | None, until: float) -> None:
    """Print the views over the store at ``path`` as JSON (the chDB reader's process)."""
    store = open_store_readonly(path)
    try:
        print(json.dumps(_views(store, Window(since, until))))
    finally:
        store.shutdown()


def _python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_SECONDS, check=False,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _service(path: Path | str) -> CollectorService:
    service = CollectorService(CollectorConfig(http_port=0, grpc_port=None,
                                               store_path=str(path),
                                               assembler=FAST_ASSEMBLER, cost=FAST_COST))
    service.start()
    return service


@dataclass
class Fleet:
    whole: Path  # every record in one file
    alone: CollectorService  # a collector on that file
    replicas: list[CollectorService]  # three, each on a third of the records
    sharing: list[CollectorService]  # three on one ClickHouse store of every record
    chdb: str  # a chdb:// store of every record, read in a process of its own
    end: float


@pytest.fixture(scope="module", name="fleet")
def _fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    folder = tmp_path_factory.mktemp("remote")
    end = time.time() - 60.0
    now = end + 60.0
    records = list(synthetic_records(RECORDS, end, span_seconds=SPAN_SECONDS, seed=SEED))
    whole = folder / "whole.db"
    _fill(whole, records, _idle(now, range(6)))
    parts = []
    for i in range(3):  # each replica priced a third, and the idle of two hours
        part = folder / f"replica-{i}.db"
        _fill(part, records[i::3], _idle(now, range(2 * i, 2 * i + 2)))
        parts.append(part)
    chdb = f"chdb://{folder / 'chdb'}"
    _python(f"from tests.cli.test_remote import fill_clickhouse; "
            f"fill_clickhouse({chdb!r}, {end!r}, {now!r})")
    with pytest.MonkeyPatch.context() as env:
        env.setenv(ENV_PASSWORD, PASSWORD)
        server = ClickHouseHTTPServer(folder / "clickhouse", password=PASSWORD).start()
        url = f"clickhouse://default@127.0.0.1:{server.port}/tokenpath"
        services: list[CollectorService] = []
        try:
            fill_clickhouse(url, end, now)
            services.append(_service(whole))
            services.extend(_service(p) for p in parts)
            services.extend(_service(url) for _ in range(3))
            yield Fleet(whole, services[0], services[1:4], services[4:], chdb, end)
        finally:
            for service in services:
                service.shutdown()
            server.shutdown()


def _views(q: Any, window: Window) -> dict[str, Any]:
    return {
        "report": views.report_view(q, window).to_json(),
        "chargeback": [r.to_json() for r in views.chargeback_view(q, window,
                                                                  IdlePolicy.PROPORTIONAL)],
        "by_model": [r.to_json() for r in views.chargeback_view(q, window,
                                                                IdlePolicy.PLATFORM, "model")],
        "leaks": views.leaks_view(q, window, network_dollars_per_byte=NETWORK_DOLLARS_PER_BYTE),
        "ranked": [leak.to_json() for leak in views.rank_leaks_view(
            q, window, NETWORK_DOLLARS_PER_BYTE)],
        "timeseries": views.timeseries_view(q, window, 12),
    }


def _without_sample_parts(view: dict[str, Any]) -> dict[str, Any]:
    """The prefix table replays the newest fingerprinted records of each source's sample;
    every other figure is from aggregates."""
    view["leaks"]["cache"].pop("top_prefixes", None)
    view["leaks"]["cache"].pop("replayed", None)
    return view


def _from_file(path: Path, window: Window) -> dict[str, Any]:
    store = RecordStore(StoreConfig(path=str(path), read_only=True))
    try:
        return _views(store, window)
    finally:
        store.shutdown()


SOURCES = ("one collector", "three replicas", "three replicas, one ClickHouse store", "chdb")


def _views_from(fleet: Fleet, source: str, window: Window) -> dict[str, Any]:
    if source == "chdb":  # a process of its own: one chDB folder a process
        return dict(json.loads(_python(
            f"from tests.cli.test_remote import views_of; "
            f"views_of({fleet.chdb!r}, {window.since_unix!r}, {window.until_unix!r})")))
    urls = {"one collector": [fleet.alone.http_url],
            "three replicas": [s.http_url for s in fleet.replicas],
            "three replicas, one ClickHouse store": [s.http_url for s in fleet.sharing],
            }[source]
    remote = RemoteQueries(urls)
    try:
        return _views(remote, window)
    finally:
        remote.close()


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("hours", [None, 2.0])
def test_every_source_answers_as_the_file(fleet: Fleet, hours: float | None,
                                          source: str) -> None:
    window = Window(None if hours is None else fleet.end - hours * 3600.0, fleet.end + 1.0)
    expected = _without_sample_parts(_from_file(fleet.whole, window))
    assert expected["report"]["requests"] == (RECORDS if hours is None else
                                              expected["report"]["requests"])
    got = _without_sample_parts(_views_from(fleet, source, window))
    close(got, expected, source, QUANTILES)


def test_a_store_heard_twice_counts_once(fleet: Fleet) -> None:
    window = Window(None, fleet.end + 1.0)
    once = RemoteQueries([fleet.alone.http_url])
    twice = RemoteQueries([fleet.alone.http_url, fleet.alone.http_url])
    try:
        close(views.report_view(twice, window).to_json(),
              views.report_view(once, window).to_json(), "", QUANTILES)
    finally:
        once.close()
        twice.close()


@pytest.fixture(scope="module", name="big")
def _big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[CollectorService],
                                                                      float]]:
    """100,000 records over three replicas, a third each."""
    folder = tmp_path_factory.mktemp("remote-big")
    end = time.time() - 60.0
    records = list(synthetic_records(BYTES_RECORDS, end, span_seconds=SPAN_SECONDS, seed=7))
    services: list[CollectorService] = []
    try:
        for i in range(3):
            part = folder / f"replica-{i}.db"
            _fill(part, records[i::3], [])
            services.append(_service(part))
        del records
        yield services, end
    finally:
        for service in services:
            service.shutdown()


def test_what_collector_fetches_does_not_grow_with_the_records(
        big: tuple[list[CollectorService], float]) -> None:
    """The window of the last 1,000 records and the window of all 100,000, over three
    replicas: the bytes the report and the chargeback fetch stay within 2x."""
    replicas, end = big
    step = SPAN_SECONDS / BYTES_RECORDS
    fetched = []
    for count in (1_000, BYTES_RECORDS):
        window = Window(end - count * step + step / 2, end + 1.0)
        remote = RemoteQueries([s.http_url for s in replicas])
        try:
            report = views.report_view(remote, window)
            views.chargeback_view(remote, window)
        finally:
            remote.close()
        assert report.requests == count
        fetched.append(remote.bytes_received)
    assert fetched[1] <= 2 * fetched[0], fetched


def _cli(*args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "tokenpath.cli.main", *args, "--format",
                           "json"], capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_SECONDS, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return dict(json.loads(done.stdout))


@pytest.mark.parametrize("source", ["three replicas", "one ClickHouse store", "chdb"])
def test_report_and_chargeback_commands_read_every_source(fleet: Fleet, source: str) -> None:
    args = {"three replicas": ("--collector", ",".join(s.http_url for s in fleet.replicas)),
            "one ClickHouse store": ("--collector",
                                     ",".join(s.http_url for s in fleet.sharing)),
            "chdb": ("--store", fleet.chdb)}[source]
    merged = _cli("report", *args)
    alone = _cli("report", "--store", str(fleet.whole))
    assert merged["requests"] == alone["requests"] == RECORDS
    assert merged["cost_dollars"] == pytest.approx(alone["cost_dollars"], rel=1e-9)
    assert merged["idle_cost_dollars"] == pytest.approx(alone["idle_cost_dollars"], rel=1e-9)
    rows = _cli("chargeback", *args)["rows"]
    alone_rows = _cli("chargeback", "--store", str(fleet.whole))["rows"]
    assert sum(r["total_dollars"] for r in rows) == pytest.approx(
        alone["cost_dollars"] + alone["idle_cost_dollars"], rel=1e-9)
    close(rows, alone_rows, source)


def test_a_collector_that_cannot_be_read_is_named(fleet: Fleet) -> None:
    remote = RemoteQueries([fleet.alone.http_url, "http://127.0.0.1:9"])
    try:
        with pytest.raises(RemoteError, match=re.escape("127.0.0.1:9")):
            views.report_view(remote, Window())
    finally:
        remote.close()
