"""The views over running collectors (tokenpath/cli/remote.py on ``GET /api/aggregate``)
against the same views over the store file: the same 20,000 records answer report,
chargeback and leaks alike (counts equal, dollars to 1e-9, percentiles within the
histograms' bound) from the file, from one collector, and from three replicas each holding
a third; a collector heard twice for one store counts once; and what ``--collector``
fetches does not grow with the records in the window."""

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

from bench.store_workload import synthetic_records
from tests.collector.conftest import FAST_ASSEMBLER, FAST_COST
from tests.core.test_views import QUANTILE_KEYS, close, write
from tokenpath import views
from tokenpath.cli.remote import RemoteError, RemoteQueries
from tokenpath.collector.config import CollectorConfig
from tokenpath.collector.cost.chargeback import IdlePolicy
from tokenpath.collector.service import CollectorService
from tokenpath.collector.store import RecordStore, StoreConfig
from tokenpath.query import Window
from tokenpath.records import IdleCost

RECORDS = 20_000
SPAN_SECONDS = 6 * 3600.0
NETWORK_DOLLARS_PER_BYTE = 0.09e-9
QUANTILES = frozenset(QUANTILE_KEYS)


def _fill(path: Path, records: list[Any], idle_hours: range) -> None:
    store = RecordStore(StoreConfig(path=str(path)))
    try:
        write(store, records)
        now = time.time()
        for hour in idle_hours:
            store._write([IdleCost("pool-a", now - (hour + 1) * 3600, now - hour * 3600,
                                   0.5 + hour, 1000.0 * hour)])
    finally:
        store.shutdown()


def _service(path: Path) -> CollectorService:
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
    end: float


@pytest.fixture(scope="module", name="fleet")
def _fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    folder = tmp_path_factory.mktemp("remote")
    end = time.time() - 60.0
    records = list(synthetic_records(RECORDS, end, span_seconds=SPAN_SECONDS, seed=5))
    whole = folder / "whole.db"
    _fill(whole, records, range(6))
    parts = []
    for i in range(3):  # each replica priced a third, and the idle of two hours
        part = folder / f"replica-{i}.db"
        _fill(part, records[i::3], range(2 * i, 2 * i + 2))
        parts.append(part)
    alone = _service(whole)
    replicas = [_service(p) for p in parts]
    yield Fleet(whole, alone, replicas, end)
    for service in (alone, *replicas):
        service.shutdown()


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


@pytest.mark.parametrize("hours", [None, 2.0])
def test_one_collector_and_three_replicas_answer_as_the_file(fleet: Fleet,
                                                              hours: float | None) -> None:
    window = Window(None if hours is None else fleet.end - hours * 3600.0, fleet.end + 1.0)
    expected = _without_sample_parts(_from_file(fleet.whole, window))
    assert expected["report"]["requests"] == (RECORDS if hours is None else
                                              expected["report"]["requests"])
    for urls in ([fleet.alone.http_url], [s.http_url for s in fleet.replicas]):
        remote = RemoteQueries(urls)
        try:
            got = _without_sample_parts(_views(remote, window))
        finally:
            remote.close()
        close(got, expected, "", QUANTILES)


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


def test_what_collector_fetches_does_not_grow_with_the_records(fleet: Fleet) -> None:
    """The window of the last 1,000 records and the window of all 20,000: the bytes the
    report and the chargeback fetch stay within 2x."""
    step = SPAN_SECONDS / RECORDS
    fetched = []
    for count in (1_000, RECORDS):
        window = Window(fleet.end - count * step + step / 2, fleet.end + 1.0)
        remote = RemoteQueries([s.http_url for s in fleet.replicas])
        try:
            report = views.report_view(remote, window)
            views.chargeback_view(remote, window)
        finally:
            remote.close()
        assert report.requests == count
        fetched.append(remote.bytes_received)
    assert fetched[1] <= 2 * fetched[0], fetched


def test_report_and_chargeback_commands_read_the_replicas(fleet: Fleet) -> None:
    urls = ",".join(s.http_url for s in fleet.replicas)

    def cli(*args: str) -> dict[str, Any]:
        done = subprocess.run([sys.executable, "-m", "tokenpath.cli.main", *args, "--format",
                               "json"], capture_output=True, text=True, timeout=300,
                              check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        return dict(json.loads(done.stdout))

    merged = cli("report", "--collector", urls)
    alone = cli("report", "--store", str(fleet.whole))
    assert merged["requests"] == alone["requests"] == RECORDS
    assert merged["cost_dollars"] == pytest.approx(alone["cost_dollars"], rel=1e-9)
    assert merged["idle_cost_dollars"] == pytest.approx(alone["idle_cost_dollars"], rel=1e-9)
    rows = cli("chargeback", "--collector", urls)["rows"]
    assert sum(r["total_dollars"] for r in rows) == pytest.approx(
        alone["cost_dollars"] + alone["idle_cost_dollars"], rel=1e-9)


def test_a_collector_that_cannot_be_read_is_named(fleet: Fleet) -> None:
    remote = RemoteQueries([fleet.alone.http_url, "http://127.0.0.1:9"])
    try:
        with pytest.raises(RemoteError, match=re.escape("127.0.0.1:9")):
            views.report_view(remote, Window())
    finally:
        remote.close()
