"""The ClickHouse store (collector/store/clickhouse.py) on chDB, the same engine in-process,
against the SQLite store holding the same records: the views (report, chargeback, leaks,
ranked leaks, time series) equal (counts equal, dollars to 1e-9 relative, percentiles
within QUANTILE_RELATIVE_ERROR of the exact ones), records read back as written; the
schema derived from the layout; the writer's retries and drops; the URL and password
rules. Skipped when chdb cannot be imported."""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("chdb")
pytest.importorskip("clickhouse_connect")

from bench.store_workload import synthetic_records
from testkit.oracles.report import build_report
from testkit.oracles.timeseries import timeseries_view
from tests.core.test_views import END, QUANTILE_KEYS, WINDOWS, close, in_window
from tokenpath import query, views
from tokenpath.collector.batch_sender import GiveUp, Retry
from tokenpath.collector.cost.chargeback import IdlePolicy
from tokenpath.collector.stats import CollectorStats
from tokenpath.collector.store import RecordStore, Store, StoreConfig
from tokenpath.collector.store import clickhouse as ch
from tokenpath.collector.store import clickhouse_client as chclient
from tokenpath.collector.store import clickhouse_sql as chsql
from tokenpath.collector.store import layout as L
from tokenpath.collector.store.clickhouse import ClickHouseStore
from tokenpath.collector.store.factory import make_store
from tokenpath.collector.store.url import DEFAULT_DATABASE, parse_url
from tokenpath.config import ConfigError
from tokenpath.query import QUANTILE_RELATIVE_ERROR, Window
from tokenpath.records import IdleCost

# The records are from 2023; the TTL deletes by the wall clock: keep them.
RETENTION = 20 * 365 * 86400.0
FIRST_BATCH = 500


def _write(store: Store, items: list[Any]) -> None:
    """Through the store's sink and writer thread, as the collector writes."""
    store.start()
    for item in items:
        if isinstance(item, IdleCost):
            store.consume_idle_cost(item)
        else:
            store.consume_record(item)
    assert store.flush()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[tuple[Store, Store]]:
    """The same 4,000 synthetic records over 6 hours, and idle cost, in a SQLite store
    and a chDB store (one chDB folder for the module: chDB opens one in a process)."""
    folder = tmp_path_factory.mktemp("chdb") / "store"
    clickhouse = make_store(StoreConfig(path=f"chdb://{folder}", retention_seconds=RETENTION),
                            clock=lambda: END)
    sqlite = RecordStore(StoreConfig(path=str(folder.parent / "s.db"),
                                     retention_seconds=RETENTION), clock=lambda: END)
    assert isinstance(clickhouse, ClickHouseStore)
    records = list(synthetic_records(4000, END, span_seconds=6 * 3600.0, seed=3))
    idle = [IdleCost("pool-a", END - (hour + 1) * 3600, END - hour * 3600, 0.5 + hour,
                     1000.0 * hour) for hour in range(7)]
    _write(sqlite, [*records, *idle])
    # the first 500 as one batch of known content (test_a_batch_written_again_...)
    writer = ch.ClickHouseWriter(clickhouse._conn, CollectorStats())
    writer.write(writer.prepare(records[:FIRST_BATCH], []))
    _write(clickhouse, [*records[FIRST_BATCH:], *idle])
    yield sqlite, clickhouse
    clickhouse.shutdown()
    sqlite.shutdown()


def test_the_records_read_back_as_written(pair: tuple[Store, Store]) -> None:
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


def test_a_batch_written_again_is_not_written_twice(pair: tuple[Store, Store]
                                                     ) -> None:
    """A retry after a lost answer sends the batch again with the same token: the table
    keeps one copy."""
    _, clickhouse = pair
    assert isinstance(clickhouse, ClickHouseStore)
    records = list(synthetic_records(4000, END, span_seconds=6 * 3600.0, seed=3))
    records = records[:FIRST_BATCH]
    writer = ch.ClickHouseWriter(clickhouse._conn, CollectorStats())
    writer.write(writer.prepare(records, []))
    assert clickhouse.count() == 4000


def test_a_trace_s_records_match(pair: tuple[Store, Store]) -> None:
    sqlite, clickhouse = pair
    for record in sqlite.records(limit=20):
        mine = [r.to_json() for r in clickhouse.records_of_trace(record.trace_id)]
        assert mine == [r.to_json() for r in sqlite.records_of_trace(record.trace_id)]
        assert mine


@pytest.mark.parametrize("name", list(WINDOWS))
def test_the_report_matches_the_sqlite_store(pair: tuple[Store, Store],
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
def test_chargeback_matches_the_sqlite_store(pair: tuple[Store, Store], by: str,
                                             policy: IdlePolicy) -> None:
    sqlite, clickhouse = pair
    window = WINDOWS["last 4.5 h"]
    mine = [r.to_json() for r in views.chargeback_view(clickhouse, window, policy, by)]
    theirs = [r.to_json() for r in views.chargeback_view(sqlite, window, policy, by)]
    close(mine, theirs, "chargeback")


@pytest.mark.parametrize("name", ["all", "last 4.5 h"])
def test_the_time_series_matches_the_sqlite_store(pair: tuple[Store, Store],
                                                  name: str) -> None:
    sqlite, clickhouse = pair
    window = WINDOWS[name]
    records = in_window(sqlite.records(), window)
    mine = views.timeseries_view(clickhouse, window, 24)
    close(mine, timeseries_view(records, 24), "timeseries",
          frozenset({"ttft_p50_seconds"}))
    close(mine, views.timeseries_view(sqlite, window, 24), "timeseries",
          frozenset({"ttft_p50_seconds"}))


@pytest.mark.parametrize(("long_context_tokens", "threshold"), [(8192, 0.5), (3000, 0.8)])
def test_the_leaks_match_the_sqlite_store(pair: tuple[Store, Store],
                                          long_context_tokens: int, threshold: float) -> None:
    sqlite, clickhouse = pair
    window = WINDOWS["last 4.5 h"]
    mine, theirs = (views.leaks_view(s, window, 10, long_context_tokens,
                                     packets_per_token_threshold=threshold,
                                     network_dollars_per_byte=1e-10)
                    for s in (clickhouse, sqlite))
    close(mine, theirs, "leaks")


def test_the_ranked_leaks_match_the_sqlite_store(pair: tuple[Store, Store]) -> None:
    sqlite, clickhouse = pair
    mine, theirs = ([leak.to_json() for leak in views.rank_leaks_view(
        s, WINDOWS["all"], 1e-10, replay_routing=True)] for s in (clickhouse, sqlite))
    close(mine, theirs, "ranked", frozenset({"saving"}))


def test_the_clickhouse_bucket_is_within_the_bound(pair: tuple[Store, Store]
                                                    ) -> None:
    """ClickHouse's ``log`` may put a value at a bucket's edge in the next bucket: its
    representative is still within the bound of the value."""
    _, clickhouse = pair
    assert isinstance(clickhouse, ClickHouseStore)
    rng = random.Random(9)
    values = [0.0, -1e-9, 1e-300, 1.0, -3.5, *[rng.lognormvariate(0, 6) for _ in range(500)]]
    select = " UNION ALL ".join(
        f"SELECT {i} AS i, {chsql.S.bucket_key_sql(repr(v), chsql.S.CLICKHOUSE)} AS k"
        for i, v in enumerate(values))
    keys = dict(clickhouse._conn.rows(f"SELECT i, k FROM ({select})"))
    for i, value in enumerate(values):
        assert query.bucket_value(int(keys[i])) == pytest.approx(
            value, rel=QUANTILE_RELATIVE_ERROR + 1e-12, abs=1e-300), value


def test_the_schema_follows_the_layout(pair: tuple[Store, Store]) -> None:
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
    assert (chsql.SCHEMA_VERSION, chsql.COLUMNS_SIGNATURE) in conn.rows(
        "SELECT version, columns_signature FROM schema_version FINAL")
    # opened again: nothing added, the same version row
    chsql.ensure_schema(conn, RETENTION)
    assert len(conn.rows("SELECT * FROM schema_version FINAL")) == 1
    # another retention: the TTL follows it
    for retention in (RETENTION + 3600, RETENTION):
        chsql.ensure_schema(conn, retention)
        for table in ("records", "idle_cost", "joined_traces", *chsql.R.ROLLUP_TABLES):
            ((create,),) = conn.rows("SELECT create_table_query FROM system.tables WHERE "
                                     f"database = currentDatabase() AND name = '{table}'")
            assert f"toIntervalSecond({int(retention)})" in create, create
    assert clickhouse.count() == 4000


class _Result:
    result_rows: list[Any] = []


class _FlakyClient:
    """A clickhouse-connect client (the methods the store calls) whose inserts into
    ``failing`` raise ``error`` the first ``failures`` times; queries find nothing."""

    def __init__(self, failures: int = 0, error: Exception | None = None,
                 failing: str = "records") -> None:
        self.failures = failures
        self.error = error or ConnectionError("server went away")
        self.failing = failing
        self.inserted: list[tuple[str, int, str]] = []
        self.release: threading.Event | None = None

    def query(self, sql: str) -> _Result:
        return _Result()

    def command(self, sql: str) -> None:
        pass

    def insert(self, table: str, rows: list[list[Any]], column_names: Any,
               settings: dict[str, str]) -> None:
        if table == "meta" or table == "schema_version":
            return
        if self.release is not None:
            assert self.release.wait(30)
        if table == self.failing and self.failures > 0:
            self.failures -= 1
            raise self.error
        self.inserted.append((table, len(rows), settings["insert_deduplication_token"]))

    def close(self) -> None:
        pass


def _store(client: _FlakyClient, stats: CollectorStats, **config: Any) -> ClickHouseStore:
    return ClickHouseStore(StoreConfig(path="clickhouse://test@db/tokenpath", **config),
                           stats, client=client)


def test_a_failed_insert_is_retried_with_the_same_tokens() -> None:
    """Every insert of a batch is sent again with the token it had, so what went in
    before the failure is deduplicated, not written twice."""
    client = _FlakyClient(2, failing="idle_cost")
    writer = ch.ClickHouseWriter(chclient.Connection(client), CollectorStats())
    records = list(synthetic_records(20, END, span_seconds=60.0))
    batch = writer.prepare(records, [IdleCost("p", END - 60, END, 1.0, 0.0)])
    for _ in range(2):
        with pytest.raises(Retry):
            writer.write(batch)
    writer.write(batch)
    tokens = [token for table, _, token in client.inserted if table == "records"]
    assert len(tokens) == 3 and len(set(tokens)) == 1
    assert [t for t, _, _ in client.inserted].count("idle_cost") == 1
    again = writer.prepare(records, [IdleCost("p", END - 60, END, 1.0, 0.0)])
    assert again.inserts == batch.inserts  # the same rows and tokens from the same batch


@pytest.mark.parametrize(("error", "transient"), [
    (ConnectionError("reset"), True),
    (TimeoutError(), True),
    (RuntimeError("Code: 252. DB::Exception: Too many parts"), True),
    (RuntimeError("Code: 241. DB::Exception: Memory limit exceeded"), True),
    (RuntimeError("Code: 53. DB::Exception: Type mismatch"), False),
    (RuntimeError("Code: 60. DB::Exception: Unknown table"), False),
])
def test_what_passes_is_retried_and_what_is_refused_is_not(error: Exception,
                                                          transient: bool) -> None:
    assert ch.is_transient(error) is transient
    writer = ch.ClickHouseWriter(chclient.Connection(_FlakyClient(1, error)), CollectorStats())
    with pytest.raises(Retry if transient else GiveUp):
        writer.write(writer.prepare(list(synthetic_records(1, END, span_seconds=60.0)), []))


def test_an_outage_is_outlasted_and_nothing_is_dropped(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    monkeypatch.setattr("tokenpath.collector.batch_sender.INITIAL_BACKOFF_SECONDS", 0.01)
    stats = CollectorStats()
    client = _FlakyClient(6)
    store = _store(client, stats, batch_size=10)
    _write(store, list(synthetic_records(25, END, span_seconds=60.0)))
    store.shutdown()
    assert client.failures == 0
    assert sum(n for table, n, _ in client.inserted if table == "records") == 25
    assert stats.records_stored.value == 25
    assert stats.records_dropped.total() == 0


def test_what_is_given_up_is_counted_by_reason() -> None:
    stats = CollectorStats()
    refused = _FlakyClient(1, RuntimeError("Code: 53. DB::Exception: Type mismatch"))
    store = _store(refused, stats, batch_size=10)
    _write(store, list(synthetic_records(7, END, span_seconds=60.0)))
    store.shutdown()
    assert stats.records_dropped["store_rejected"] == 7
    expired = _FlakyClient(10**6)
    store = _store(expired, stats, write_retry_seconds=0.0)
    _write(store, list(synthetic_records(3, END, span_seconds=60.0)))
    store.shutdown()
    assert stats.records_dropped[ch.DROP_STORE_WRITE_FAILED] == 3
    store.consume_record(next(iter(synthetic_records(1, END, span_seconds=60.0))))
    assert stats.records_dropped["store_closed"] == 1
    assert stats.records_stored.value == 0


def test_a_failed_idle_insert_is_retried_with_its_batch(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    monkeypatch.setattr("tokenpath.collector.batch_sender.INITIAL_BACKOFF_SECONDS", 0.01)
    stats = CollectorStats()
    client = _FlakyClient(2, failing="idle_cost")
    store = _store(client, stats)
    _write(store, [*synthetic_records(5, END, span_seconds=60.0),
                   IdleCost("p", END - 60, END, 1.0, 0.0)])
    store.shutdown()
    assert [t for t, _, _ in client.inserted].count("idle_cost") == 1
    assert stats.records_stored.value == 5 and stats.store_errors.value == 0


def test_a_full_queue_makes_the_caller_wait() -> None:
    """While the writer is stuck, a put into the full queue waits; nothing is dropped,
    and the backlog tells admission to refuse new data meanwhile."""
    stats = CollectorStats()
    client = _FlakyClient()
    client.release = threading.Event()
    store = _store(client, stats, queue_size=2, batch_size=1)
    store.start()
    records = list(synthetic_records(6, END, span_seconds=60.0))
    done = threading.Event()

    def produce() -> None:
        for r in records:
            store.consume_record(r)
        done.set()

    producer = threading.Thread(target=produce)
    producer.start()
    # one in the writer, one queued: full, so the producer waits
    deadline = time.monotonic() + 30
    while store.queue_depth < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store.backlog().over()
    assert not done.is_set()
    client.release.set()
    assert done.wait(30)
    producer.join()
    store.shutdown()
    assert sum(n for table, n, _ in client.inserted if table == "records") == 6
    assert stats.records_dropped.total() == 0


def test_urls_and_passwords(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = parse_url("clickhouses://reader@db.example:9440/usage")
    assert (target.scheme, target.host, target.port, target.user, target.database) == (
        "clickhouses", "db.example", 9440, "reader", "usage")
    assert parse_url("clickhouse://db").database == DEFAULT_DATABASE
    assert parse_url(f"chdb://{tmp_path}/x").path == f"{tmp_path}/x"
    with pytest.raises(ConfigError, match="shows in ps"):
        parse_url("clickhouse://u:secret@db/x")
    monkeypatch.delenv(chclient.ENV_PASSWORD, raising=False)
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    monkeypatch.setenv(chclient.ENV_PASSWORD_FILE, str(secret))
    assert chclient.password() == "s3cret"
    monkeypatch.setenv(chclient.ENV_PASSWORD, "from-env")
    assert chclient.password() == "from-env"
    assert "s3cret" not in target.describe()


def test_a_chdb_folder_has_one_owner(tmp_path: Path) -> None:
    owner = chclient.Owner(str(tmp_path), exclusive=True)
    try:
        owner.announce("http://127.0.0.1:4318")
        with pytest.raises(ConfigError, match=r"--collector http://127.0.0.1:4318"):
            chclient.Owner(str(tmp_path), exclusive=False)
    finally:
        owner.release()
    reader = chclient.Owner(str(tmp_path), exclusive=False)
    reader.release()


def test_non_finite_values_are_stored_as_the_sqlite_store_stores_them() -> None:
    record = next(iter(synthetic_records(1, END, span_seconds=60.0)))
    record.ttft_seconds = math.inf
    record.cost_dollars = math.nan
    row = chsql.encode(L.RowEncoder(chsql.TextNames()), record)
    assert row[L.COLUMN_INDEX["ttft_seconds"]] is None
    assert row[L.COLUMN_INDEX["cost_dollars"]] == 0.0


# --- the rollups -----------------------------------------------------------------------------


class _InDatabase:
    """The module's chDB client, used in another database (chDB opens one folder in a
    process): a second store beside ``pair``'s."""

    def __init__(self, conn: chclient.Connection, database: str) -> None:
        self._conn = conn
        self._database = database
        conn.command(f"CREATE DATABASE IF NOT EXISTS {database}")

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        with self._conn.lock:
            client = self._conn.client
            before = client.database
            client.database = self._database
            try:
                return getattr(client, method)(*args, **kwargs)
            finally:
                client.database = before

    def query(self, sql: str) -> Any:
        return self._call("query", sql)

    def command(self, sql: str) -> Any:
        return self._call("command", sql)

    def insert(self, table: str, rows: list[list[Any]], column_names: Any,
               settings: dict[str, Any]) -> None:
        self._call("insert", table, rows, column_names=column_names, settings=settings)

    def close(self) -> None:
        pass


LATE_BATCH = 250


@pytest.fixture(scope="module")
def late(pair: tuple[Store, Store], tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[tuple[Store, ClickHouseStore, list[Any]]]:
    """A SQLite and a ClickHouse store given 3,000 records over 6 hours, then (after the
    rollups hold their periods, merged) 600 that ended in the first 3 of those hours: late
    records, into periods already rolled up. The ClickHouse store's batches (of
    LATE_BATCH, by its writer) are returned, to send one again."""
    _, clickhouse = pair
    assert isinstance(clickhouse, ClickHouseStore)
    store = ClickHouseStore(StoreConfig(path="clickhouse://test@db/late",
                                        retention_seconds=RETENTION),
                            client=_InDatabase(clickhouse._conn, "late"))
    sqlite = RecordStore(StoreConfig(path=str(tmp_path_factory.mktemp("late") / "s.db"),
                                     retention_seconds=RETENTION), clock=lambda: END)
    on_time = list(synthetic_records(3000, END, span_seconds=6 * 3600.0, seed=11))
    late_ones = list(synthetic_records(600, END - 3 * 3600, span_seconds=3 * 3600.0, seed=12,
                                       first=3000))
    writer = ch.ClickHouseWriter(store._conn, CollectorStats())
    batches = []
    for records in (on_time, late_ones):
        _write(sqlite, records)
        for i in range(0, len(records), LATE_BATCH):
            batches.append(writer.prepare(records[i:i + LATE_BATCH], []))
            writer.write(batches[-1])
        if records is on_time:
            for table in chsql.R.ROLLUP_TABLES:
                store._conn.command(f"OPTIMIZE TABLE {table} FINAL")
            first = int((END - 6 * 3600) // 600) + 1
            assert store._conn.rows(f"SELECT count() FROM rollup WHERE period = {first}"
                                    ) == [(1,)]
    yield sqlite, store, batches
    sqlite.shutdown()


def _rollups(conn: chclient.Connection) -> dict[str, list[tuple[Any, ...]]]:
    """What the rollups hold, each key's rows combined."""
    return {
        "rollup": conn.rows("SELECT period, sum(m_n), round(sum(m_cost), 9), "
                            "min(m_min_start), max(m_max_end), sum(m_lm_streams) FROM rollup "
                            "GROUP BY period ORDER BY period"),
        "rollup_by": conn.rows("SELECT period, tenant, model, pool, sum(m_n), "
                               "round(sum(m_cost), 9) FROM rollup_by GROUP BY ALL ORDER BY ALL"),
        "rollup_hist": conn.rows("SELECT period, histogram, bucket, sum(n) FROM rollup_hist "
                                 "GROUP BY ALL ORDER BY ALL"),
        "rollup_units": conn.rows("SELECT DISTINCT period, node, engine_id FROM rollup_units "
                                  "ORDER BY ALL"),
        "records_long": conn.rows("SELECT count(), sum(input_tokens), min(end_unix) "
                                  "FROM records_long"),
    }


def test_late_records_are_added_to_their_periods(late: tuple[Store, ClickHouseStore, Any]
                                                 ) -> None:
    _, store, _ = late
    conn = store._conn
    by_period = conn.rows(f"SELECT {chsql.S.CLICKHOUSE.period()} AS p, count() FROM records "
                          "GROUP BY p ORDER BY p")
    assert sum(n for _, n in by_period) == 3600
    held = _rollups(conn)
    assert [(p, n) for p, n, *_ in held["rollup"]] == by_period
    assert conn.rows("SELECT sum(m_n) FROM rollup_by") == [(3600,)]
    ttft = chsql.S.HISTOGRAM_INDEX["ttft"]
    assert conn.rows(f"SELECT sum(n) FROM rollup_hist WHERE histogram = {ttft}") == conn.rows(
        "SELECT count() FROM records WHERE ttft_seconds IS NOT NULL")
    assert conn.rows("SELECT count() FROM records_long") == conn.rows(
        f"SELECT count() FROM records WHERE {chsql.R.LONG_WHERE}") != [(0,)]


CUTS = {"since, mid-period": Window(END - 4 * 3600 - 123.25),
        "both ends mid-period": Window(END - 5 * 3600 - 299.5, END - 3000.75),
        "on period edges": Window((END - 5 * 3600) // 600 * 600, (END - 3600) // 600 * 600),
        "inside one period": Window((END - 3 * 3600) // 600 * 600 + 10.5,
                                    (END - 3 * 3600) // 600 * 600 + 400.0),
        "all": Window()}


@pytest.mark.parametrize("name", list(CUTS))
def test_windows_cutting_periods_match_the_sqlite_store(
        late: tuple[Store, ClickHouseStore, Any], name: str) -> None:
    sqlite, store, _ = late
    window = CUTS[name]
    assert views.report_view(store, window).requests == len(in_window(sqlite.records(),
                                                                      window))
    close(views.report_view(store, window).to_json(),
          views.report_view(sqlite, window).to_json(), "report", frozenset(QUANTILE_KEYS))
    for by in ("tenant", "model", "pool"):
        mine, theirs = ([r.to_json() for r in views.chargeback_view(s, window, by=by)]
                        for s in (store, sqlite))
        close(mine, theirs, "chargeback")
    close(views.leaks_view(store, window, 10, 3000, network_dollars_per_byte=1e-10),
          views.leaks_view(sqlite, window, 10, 3000, network_dollars_per_byte=1e-10), "leaks")


def test_the_views_read_the_rollups(late: tuple[Store, ClickHouseStore, Any],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The report and chargeback of a long window read its whole periods from the rollups
    and agree with the same views read from ``records`` alone."""
    _, store, _ = late
    read = chsql.R.read
    calls: list[tuple[int, int | None]] = []

    def counted(conn: Any, periods: tuple[int, int | None], *args: Any) -> Any:
        calls.append(periods)
        return read(conn, periods, *args)

    monkeypatch.setattr(chsql.R, "read", counted)
    window = CUTS["both ends mid-period"]
    with_rollups = views.report_view(store, window).to_json()
    grouped = [r.to_json() for r in views.chargeback_view(store, window)]
    # the report's measures, its SLO classes' (grouped by class) and the chargeback's
    assert len(calls) == 3 and calls[0][1] is not None and calls[0][1] - calls[0][0] > 20
    monkeypatch.setattr(store.queries, "_rollups", False)
    close(with_rollups, views.report_view(store, window).to_json(), "report")
    close(grouped, [r.to_json() for r in views.chargeback_view(store, window)], "chargeback")
    assert len(calls) == 3


def test_a_retried_batch_leaves_the_rollups_unchanged(
        late: tuple[Store, ClickHouseStore, Any]) -> None:
    """A batch sent again with its token (a retry after a lost answer) is dropped by
    ``records`` and by every rollup's view."""
    _, store, batches = late
    before = _rollups(store._conn)
    writer = ch.ClickHouseWriter(store._conn, CollectorStats())
    for batch in (batches[0], batches[-1]):
        writer.write(batch)
    assert store.count() == 3600
    assert _rollups(store._conn) == before


def test_the_retention_edge_is_read_from_records(late: tuple[Store, ClickHouseStore, Any],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The periods whose records the TTL may have begun deleting are read from
    ``records``, the newer ones from the rollups: the views are the same."""
    sqlite, store, _ = late
    now = END + RETENTION - 4 * 3600
    monkeypatch.setattr(store.queries, "_clock", lambda: now)
    first = chsql.R.first_kept_period(RETENTION, now)
    assert (END - 6 * 3600) / 600 < first < (END - 3600) / 600
    assert store.queries._rollup_from() == first
    close(views.report_view(store, Window()).to_json(),
          views.report_view(sqlite, Window()).to_json(), "report", frozenset(QUANTILE_KEYS))


def test_a_store_without_rollups_gets_them_built(late: tuple[Store, ClickHouseStore, Any]
                                                 ) -> None:
    """A store whose rollups are missing or another version's (meta's signature) gets
    them rebuilt from ``records`` at start: the same rollups."""
    _, store, _ = late
    conn = store._conn
    before = _rollups(conn)
    conn.command("DROP VIEW rollup_hist_mv")
    conn.command("DROP TABLE rollup_hist")
    conn.insert("meta", [["rollup", "another version", time.time()]], ("key", "value", "at"),
                "meta-old-rollups")
    chsql.ensure_schema(conn, RETENTION)
    assert _rollups(conn) == before
    assert chsql._meta(conn, "rollup") == chsql.R.signature(chsql.COLUMN_TYPES)
