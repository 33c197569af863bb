"""The ClickHouse store over the HTTP interface (``clickhouse://``, the real
clickhouse-connect HTTP client) against testkit/fakes/clickhouse_http.py, ClickHouse's HTTP
interface over chDB: records read back as written, the password is checked, a write whose
answer was lost is retried and deduplicated, a reader sees what the writer wrote. Skipped
when chdb or clickhouse-connect cannot be imported."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("chdb")
pytest.importorskip("clickhouse_connect")

from bench.store_workload import synthetic_records
from testkit.fakes.clickhouse_http import ClickHouseHTTPServer
from tests.core.test_views import END
from tokenpath.collector.stats import CollectorStats
from tokenpath.collector.store import StoreConfig
from tokenpath.collector.store import clickhouse_client as chclient
from tokenpath.collector.store.clickhouse import ClickHouseStore
from tokenpath.collector.store.factory import make_store, open_store_readonly
from tokenpath.config import ConfigError
from tokenpath.records import RequestRecord

PASSWORD = "s3cret"
RETENTION = 20 * 365 * 86400.0  # the records are from 2023; the TTL deletes by the wall clock


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ClickHouseHTTPServer]:
    monkeypatch.setenv(chclient.ENV_PASSWORD, PASSWORD)
    fake = ClickHouseHTTPServer(tmp_path / "clickhouse", password=PASSWORD).start()
    yield fake
    fake.shutdown()
    fake.shutdown()  # idempotent


def _store(server: ClickHouseHTTPServer, stats: CollectorStats | None = None
           ) -> ClickHouseStore:
    store = make_store(StoreConfig(path=f"clickhouse://default@127.0.0.1:{server.port}/tp",
                                   retention_seconds=RETENTION), stats)
    assert isinstance(store, ClickHouseStore)
    return store


def _write(store: ClickHouseStore, records: list[RequestRecord]) -> None:
    """Through the store's sink and its sender's thread, as the collector writes."""
    store.start()
    for record in records:
        store.consume_record(record)
    assert store.flush()


def test_records_read_back_as_written_over_http(server: ClickHouseHTTPServer) -> None:
    records = list(synthetic_records(300, END, span_seconds=3600.0, seed=5))
    writer = _store(server)
    try:
        _write(writer, records)
        reader = open_store_readonly(f"clickhouse://default@127.0.0.1:{server.port}/tp")
        try:
            assert reader.count() == 300
            mine = {r.record_id: r.to_json() for r in reader.records()}
            assert mine == {r.record_id: r.to_json() for r in records}
        finally:
            reader.shutdown()
    finally:
        writer.shutdown()
    assert any(s.startswith("INSERT INTO `records`") for s in server.statements)


def test_a_wrong_password_is_refused(server: ClickHouseHTTPServer,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(chclient.ENV_PASSWORD, "wrong")
    with pytest.raises(ConfigError, match="516"):
        _store(server)


def test_a_lost_answer_is_retried_and_written_once(server: ClickHouseHTTPServer) -> None:
    stats = CollectorStats()
    store = _store(server, stats)
    try:
        records = list(synthetic_records(50, END, span_seconds=60.0, seed=9))
        server.lose_insert_answers = 1  # the insert runs; its answer never comes
        _write(store, records)
        assert server.lose_insert_answers == 0
        inserts = [s for s in server.statements if s.startswith("INSERT INTO `records`")]
        assert len(inserts) == 2  # sent again, with the same deduplication token
        assert store.count() == 50
        assert stats.records_stored.value == 50 and stats.records_dropped.total() == 0
    finally:
        store.shutdown()


def test_the_fake_answers_the_client_as_a_server(server: ClickHouseHTTPServer) -> None:
    """Bind parameters, a ClickHouse error's code, an outage and its end, as the real
    client meets them."""
    import clickhouse_connect
    from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError

    client = clickhouse_connect.get_client(host="127.0.0.1", port=server.port,
                                           username="default", password=PASSWORD,
                                           autogenerate_session_id=False)
    try:
        assert client.query("SELECT {x:Int64} + 1", parameters={"x": 41}).result_rows == [(42,)]
        with pytest.raises(DatabaseError) as error:
            client.query("SELECT no_such_function()")
        assert error.value.code == 46  # UNKNOWN_FUNCTION
        server.pause()
        with pytest.raises(OperationalError):
            client.command("SELECT 1")
        server.resume()
        assert client.command("SELECT 2") == 2
    finally:
        client.close()


def test_an_insert_of_many_blocks_is_written_whole(server: ClickHouseHTTPServer) -> None:
    """A batch of thousands of records goes as several Native blocks, each compressed as a
    frame of its own, in one request: every one of them is stored (the fake once read the
    first frame only and lost the rest without an error)."""
    records = list(synthetic_records(8000, END, span_seconds=3600.0, seed=6))
    writer = _store(server)
    try:
        _write(writer, records)
        assert writer.count() == len(records)
    finally:
        writer.shutdown()
