"""The ClickHouse store (collector/store_clickhouse.py) on chDB, the same engine in-process,
against the SQLite store holding the same records: the views (report, chargeback, leaks,
ranked leaks, time series) equal (counts equal, dollars to 1e-9 relative, percentiles
within QUANTILE_RELATIVE_ERROR of the exact ones), records read back as written; the
schema derived from the layout; the writer's retries and drops; the URL and password
rules. Skipped when chdb cannot be imported."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("chdb")
pytest.importorskip("clickhouse_connect")

from bench.store_workload import synthetic_records
from tests.core.test_views import END, QUANTILE_KEYS, WINDOWS, close, in_window
from tokenpath import query, views
from tokenpath.collector import api_views
from tokenpath.collector import store_clickhouse as ch
from tokenpath.collector import store_layout as L
from tokenpath.collector.cost.chargeback import IdlePolicy
from tokenpath.collector.stats import CollectorStats
from tokenpath.collector.store import (
    ClickHouseStore,
    RecordStore,
    StoreConfig,
    make_store,
)
from tokenpath.config import ConfigError
from tokenpath.pipeline import IdleCost
from tokenpath.query import QUANTILE_RELATIVE_ERROR
from tokenpath.report import build_report

# The records are from 2023; the TTL deletes by the wall clock: keep them.
RETENTION = 20 * 365 * 86400.0


def _write(store: RecordStore, records: list[Any]) -> None:
    for i in range(0, len(records), 500):
        store._write(list(records[i:i + 500]))


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[tuple[RecordStore, RecordStore]]:
    """The same 4,000 synthetic records over 6 hours, and idle cost, in a SQLite store
    and a chDB store (one chDB folder for the module: chDB opens one in a process)."""
    folder = tmp_path_factory.mktemp("chdb") / "store"
    clickhouse = make_store(StoreConfig(path=f"chdb://{folder}", retention_seconds=RETENTION),
                            clock=lambda: END)
    sqlite = RecordStore(StoreConfig(path=str(folder.parent / "s.db"),
                                     retention_seconds=RETENTION), clock=lambda: END)
    assert isinstance(clickhouse, ClickHouseStore)
    records = list(synthetic_records(4000, END, span_seconds=6 * 3600.0, seed=3))
    for store in (sqlite, clickhouse):
        _write(store, records)
        for hour in range(7):
            store._write([IdleCost("pool-a", END - (hour + 1) * 3600, END - hour * 3600,
                                   0.5 + hour, 1000.0 * hour)])
    yield sqlite, clickhouse
    clickhouse.shutdown()
    sqlite.shutdown()


def test_the_records_read_back_as_written(pair: tuple[RecordStore, RecordStore]) -> None:
    sqlite, clickhouse = pair
    assert clickhouse.count() == sqlite.count() == 4000
    mine = {r.record_id: r.to_json() for r in clickhouse.records()}
    theirs = {r.record_id: r.to_json() for r in sqlite.records()}
    assert mine == theirs
    some = next(iter(theirs))
    found = clickhouse.record(some)
    assert found is not None and found.to_json() == theirs[some]
    assert clickhouse.idle_cost_dollars(END - 3 * 3600) == pytest.approx(
        sqlite.idle_cost_dollars(END - 3 * 3600), rel=1e-12)
    assert clickhouse.idle_energy_joules() == pytest.approx(sqlite.idle_energy_joules())
    for window in WINDOWS.values():
        assert clickhouse.end_range(window) == sqlite.end_range(window)
        a, b = clickhouse.sample(window, 50), sqlite.sample(window, 50)
        assert a.of == b.of
        assert [r.end_unix for r in a.records] == [r.end_unix for r in b.records]


def test_a_batch_written_again_is_not_written_twice(pair: tuple[RecordStore, RecordStore]
                                                     ) -> None:
    """A retry after a lost answer sends the batch again with the same token: the table
    keeps one copy."""
    _, clickhouse = pair
    assert isinstance(clickhouse, ClickHouseStore)
    records = list(synthetic_records(4000, END, span_seconds=6 * 3600.0, seed=3))[:500]
    ch.ClickHouseWriter(clickhouse._conn, CollectorStats()).write(records, [])
    assert clickhouse.count() == 4000


def test_a_trace_s_records_match(pair: tuple[RecordStore, RecordStore]) -> None:
    sqlite, clickhouse = pair
    for record in sqlite.records(limit=20):
        mine = [r.to_json() for r in clickhouse.records_of_trace(record.trace_id)]
        assert mine == [r.to_json() for r in sqlite.records_of_trace(record.trace_id)]
        assert mine


@pytest.mark.parametrize("name", list(WINDOWS))
def test_the_report_matches_the_sqlite_store(pair: tuple[RecordStore, RecordStore],
                                             name: str) -> None:
    sqlite, clickhouse = pair
    window = WINDOWS[name]
    mine = views.report_view(clickhouse, window).to_json()
    # quantiles: within the bound of the exact ones (the records' own percentiles)

    records = in_window(sqlite.records(), window)
    since = window.since_unix
    exact = build_report(records, sqlite.idle_cost_dollars(since),
                         sqlite.idle_energy_joules(since)).to_json()
    close(mine, exact, "report", frozenset(QUANTILE_KEYS))
    theirs = views.report_view(sqlite, window).to_json()
    close(mine, theirs, "report", frozenset(QUANTILE_KEYS))


@pytest.mark.parametrize("by", ["tenant", "model", "pool"])
@pytest.mark.parametrize("policy", list(IdlePolicy))
def test_chargeback_matches_the_sqlite_store(pair: tuple[RecordStore, RecordStore], by: str,
                                             policy: IdlePolicy) -> None:
    sqlite, clickhouse = pair
    window = WINDOWS["last 4.5 h"]
    mine = [r.to_json() for r in views.chargeback_view(clickhouse, window, policy, by)]
    theirs = [r.to_json() for r in views.chargeback_view(sqlite, window, policy, by)]
    close(mine, theirs, "chargeback")


@pytest.mark.parametrize("name", ["all", "last 4.5 h"])
def test_the_time_series_matches_the_sqlite_store(pair: tuple[RecordStore, RecordStore],
                                                  name: str) -> None:
    sqlite, clickhouse = pair
    window = WINDOWS[name]
    records = in_window(sqlite.records(), window)
    mine = views.timeseries_view(clickhouse, window, 24)
    close(mine, api_views.timeseries_view(records, 24), "timeseries",
          frozenset({"ttft_p50_seconds"}))
    close(mine, views.timeseries_view(sqlite, window, 24), "timeseries",
          frozenset({"ttft_p50_seconds"}))


@pytest.mark.parametrize(("long_context_tokens", "threshold"), [(8192, 0.5), (3000, 0.8)])
def test_the_leaks_match_the_sqlite_store(pair: tuple[RecordStore, RecordStore],
                                          long_context_tokens: int, threshold: float) -> None:
    sqlite, clickhouse = pair
    window = WINDOWS["last 4.5 h"]
    mine, theirs = (views.leaks_view(s, window, 10, long_context_tokens,
                                     packets_per_token_threshold=threshold,
                                     network_dollars_per_byte=1e-10)
                    for s in (clickhouse, sqlite))
    close(mine, theirs, "leaks")


def test_the_ranked_leaks_match_the_sqlite_store(pair: tuple[RecordStore, RecordStore]) -> None:
    sqlite, clickhouse = pair
    mine, theirs = ([leak.to_json() for leak in views.rank_leaks_view(
        s, WINDOWS["all"], 1e-10, replay_routing=True)] for s in (clickhouse, sqlite))
    close(mine, theirs, "ranked", frozenset({"saving"}))


def test_the_clickhouse_bucket_is_within_the_bound(pair: tuple[RecordStore, RecordStore]
                                                    ) -> None:
    """ClickHouse's ``log`` may put a value at a bucket's edge in the next bucket: its
    representative is still within the bound of the value."""
    _, clickhouse = pair
    assert isinstance(clickhouse, ClickHouseStore)
    rng = random.Random(9)
    values = [0.0, -1e-9, 1e-300, 1.0, -3.5, *[rng.lognormvariate(0, 6) for _ in range(500)]]
    select = " UNION ALL ".join(
        f"SELECT {i} AS i, {ch.S.bucket_key_sql(repr(v), ch.S.CLICKHOUSE)} AS k"
        for i, v in enumerate(values))
    keys = dict(clickhouse._conn.rows(f"SELECT i, k FROM ({select})"))
    for i, value in enumerate(values):
        assert query.bucket_value(int(keys[i])) == pytest.approx(
            value, rel=QUANTILE_RELATIVE_ERROR + 1e-12, abs=1e-300), value


def test_the_schema_follows_the_layout(pair: tuple[RecordStore, RecordStore]) -> None:
    _, clickhouse = pair
    assert isinstance(clickhouse, ClickHouseStore)
    conn = clickhouse._conn
    columns = [name for (name,) in conn.rows(
        "SELECT name FROM system.columns WHERE database = currentDatabase() AND "
        "table = 'records' ORDER BY position")]
    assert tuple(columns) == L.COLUMNS
    ((create,),) = conn.rows("SELECT create_table_query FROM system.tables WHERE "
                             "database = currentDatabase() AND name = 'records'")
    for part in ("MergeTree", "PARTITION BY", "TTL", "LowCardinality(String)"):
        assert part in create
    assert (ch.SCHEMA_VERSION, ch.COLUMNS_SIGNATURE) in conn.rows(
        "SELECT version, columns_signature FROM schema_version FINAL")
    # opened again: nothing added, the same version row
    ch.ensure_schema(conn, RETENTION)
    assert len(conn.rows("SELECT * FROM schema_version FINAL")) == 1
    # another retention: the TTL follows it
    for retention in (RETENTION + 3600, RETENTION):
        ch.ensure_schema(conn, retention)
        for table in ("records", "idle_cost", "joined_traces"):
            ((create,),) = conn.rows("SELECT create_table_query FROM system.tables WHERE "
                                     f"database = currentDatabase() AND name = '{table}'")
            assert f"toIntervalSecond({int(retention)})" in create, create
    assert clickhouse.count() == 4000


class _Flaky:
    """A connection whose first ``failures`` inserts fail."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.inserted: list[tuple[str, int, str]] = []

    def insert(self, table: str, rows: list[list[Any]], columns: Any, token: str) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("server went away")
        self.inserted.append((table, len(rows), token))


def test_a_failed_insert_is_retried_with_the_same_token() -> None:
    flaky = _Flaky(3)
    waits: list[float] = []
    writer = ch.ClickHouseWriter(flaky, CollectorStats(), 60.0, waits.append)  # type: ignore[arg-type]
    records = list(synthetic_records(20, END, span_seconds=60.0))
    assert writer.write(records, []) == 20
    assert waits == [0.1, 0.2, 0.4]
    assert flaky.inserted[0][:2] == ("records", 20)
    again = _Flaky(0)
    ch.ClickHouseWriter(again, CollectorStats()).write(records, [])  # type: ignore[arg-type]
    assert again.inserted[0][2] == flaky.inserted[0][2]  # a retry deduplicates


def test_records_past_the_retries_are_counted_as_dropped(tmp_path: Path) -> None:
    stats = CollectorStats()
    store = ClickHouseStore.__new__(ClickHouseStore)
    RecordStore.__init__(store, StoreConfig(), stats)  # the queue; its SQLite unused
    store._writer = ch.ClickHouseWriter(_Flaky(10**6), stats, 0.0)  # type: ignore[arg-type]
    store._write(list(synthetic_records(7, END, span_seconds=60.0)))
    assert stats.records_dropped[ch.DROP_STORE_WRITE_FAILED] == 7
    assert stats.records_stored.value == 0


class _Table(_Flaky):
    """Inserts into ``failing`` always fail."""

    def __init__(self, failing: str) -> None:
        super().__init__(0)
        self.failing = failing

    def insert(self, table: str, rows: list[list[Any]], columns: Any, token: str) -> None:
        if table == self.failing and rows:
            raise ConnectionError("no")
        super().insert(table, rows, columns, token)


def test_a_failed_idle_insert_does_not_drop_the_records() -> None:
    stats = CollectorStats()
    writer = ch.ClickHouseWriter(_Table("idle_cost"), stats, 0.0)  # type: ignore[arg-type]
    records = list(synthetic_records(5, END, span_seconds=60.0))
    assert writer.write(records, [IdleCost("p", END - 60, END, 1.0, 0.0)]) == 5
    assert stats.store_errors.value == 1


def _queued_store(stats: CollectorStats, queue_size: int) -> ClickHouseStore:
    store = ClickHouseStore.__new__(ClickHouseStore)
    RecordStore.__init__(store, StoreConfig(queue_size=queue_size, batch_size=1), stats)
    return store


def test_a_full_queue_makes_the_caller_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SQLite store's back-pressure, unchanged: while the writer is stuck (retrying),
    a put into the full queue waits, and nothing is dropped."""
    import threading

    stats = CollectorStats()
    store = _queued_store(stats, 2)
    release = threading.Event()
    written: list[int] = []

    class _Stuck:
        retry_seconds = 60.0

        def write(self, records: list[Any], idle: list[Any]) -> int:
            release.wait(30)
            written.append(len(records))
            return len(records)

    store._writer = _Stuck()  # type: ignore[assignment]
    monkeypatch.setattr("tokenpath.collector.store.PUT_WAIT_SECONDS", 0.05)
    store.start()
    records = list(synthetic_records(6, END, span_seconds=60.0))
    done = threading.Event()

    def produce() -> None:
        for r in records:
            store.consume_record(r)
        done.set()

    producer = threading.Thread(target=produce)
    producer.start()
    assert not done.wait(0.5)  # one in the writer, two queued, the producer waits
    release.set()
    assert done.wait(30)
    producer.join()
    store._closed = True
    store._queue.put(None)
    assert store._thread is not None
    store._thread.join(30)
    assert sum(written) == 6
    assert stats.records_dropped.total() == 0


def test_urls_and_passwords(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = ch.parse_url("clickhouses://reader@db.example:9440/usage")
    assert (target.scheme, target.host, target.port, target.user, target.database) == (
        "clickhouses", "db.example", 9440, "reader", "usage")
    assert ch.parse_url("clickhouse://db").database == ch.DEFAULT_DATABASE
    assert ch.parse_url(f"chdb://{tmp_path}/x").path == f"{tmp_path}/x"
    with pytest.raises(ConfigError, match="shows in ps"):
        ch.parse_url("clickhouse://u:secret@db/x")
    monkeypatch.delenv(ch.ENV_PASSWORD, raising=False)
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    monkeypatch.setenv(ch.ENV_PASSWORD_FILE, str(secret))
    assert ch.password() == "s3cret"
    monkeypatch.setenv(ch.ENV_PASSWORD, "from-env")
    assert ch.password() == "from-env"
    assert "s3cret" not in target.describe()


def test_a_chdb_folder_has_one_owner(tmp_path: Path) -> None:
    owner = ch.Owner(str(tmp_path), exclusive=True)
    try:
        owner.announce("http://127.0.0.1:4318")
        with pytest.raises(ConfigError, match=r"--collector http://127.0.0.1:4318"):
            ch.Owner(str(tmp_path), exclusive=False)
    finally:
        owner.release()
    reader = ch.Owner(str(tmp_path), exclusive=False)
    reader.release()


def test_non_finite_values_are_stored_as_the_sqlite_store_stores_them() -> None:
    record = next(iter(synthetic_records(1, END, span_seconds=60.0)))
    record.ttft_seconds = math.inf
    record.cost_dollars = math.nan
    row = ch.encode(L.RowEncoder(ch._TextNames()), record)
    assert row[L.COLUMN_INDEX["ttft_seconds"]] is None
    assert row[L.COLUMN_INDEX["cost_dollars"]] == 0.0
