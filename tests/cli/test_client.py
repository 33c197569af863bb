"""Client commands reading a live collector get every record, page by page."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tokenpath.cli import client
from tokenpath.cli.client import Source
from tokenpath.collector.config import CollectorConfig
from tokenpath.collector.service import CollectorService
from tokenpath.collector.store import RecordStore, StoreConfig
from tokenpath.records import RequestRecord

RECORDS = 25


@pytest.fixture()
def collector(tmp_path: Path) -> Iterator[CollectorService]:
    path = str(tmp_path / "store.db")
    store = RecordStore(StoreConfig(path=path))
    store.start()
    now = time.time()
    for i in range(RECORDS):
        # Pairs of records end at the same instant: page boundaries fall inside a pair.
        end = now - 100 + (i // 2)
        store.consume_record(RequestRecord(trace_id=format(i + 1, "032x"), start_unix=end - 1,
                                           end_unix=end, input_tokens=i))
    store.shutdown()
    service = CollectorService(CollectorConfig(http_port=0, grpc_port=None, store_path=path))
    service.start()
    yield service
    service.shutdown()


@pytest.mark.parametrize("page", [4, 7, 25, 10_000])
def test_records_from_a_collector_match_the_store_in_pages_of_any_size(
        collector: CollectorService, monkeypatch: pytest.MonkeyPatch, page: int) -> None:
    monkeypatch.setattr(client, "MAX_API_LIMIT", page)
    from_collector = Source(None, collector.http_url)
    from_store = Source(collector.config.store_path, None)
    everything = from_collector.records(None, None)
    assert len(everything) == RECORDS
    assert [r.trace_id for r in everything] == [r.trace_id for r in from_store.records(None,
                                                                                      None)]
    newest = from_collector.records(9, None)
    assert [r.trace_id for r in newest] == [r.trace_id for r in everything[:9]]


def test_the_api_takes_an_until_cursor_and_refuses_one_that_is_not_finite(
        collector: CollectorService) -> None:
    url = f"{collector.http_url}/api/requests"
    everything = httpx.get(url, params={"limit": 100}, timeout=5).json()
    cursor = everything[10]["end_unix"]
    older = httpx.get(url, params={"limit": 100, "until": cursor}, timeout=5).json()
    assert all(r["end_unix"] <= cursor for r in older)
    assert len(older) == len([r for r in everything if r["end_unix"] <= cursor])
    assert httpx.get(url, params={"until": "nan"}, timeout=5).status_code == 400


def test_span_text_that_looks_like_markup_is_printed_as_is(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tokenpath.cli.main import app

    path = str(tmp_path / "store.db")
    store = RecordStore(StoreConfig(path=path))
    store.start()
    for i, model in enumerate(("[/]x", "[bold]gpt-4o[/bold]-mini")):
        store.consume_record(RequestRecord(trace_id=format(i + 1, "032x"), model=model,
                                           start_unix=100.0 + i, end_unix=101.0 + i))
    store.shutdown()
    result = CliRunner().invoke(app, ["requests", "--store", path], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "[/]x" in result.output and "[bold]gpt-4o[/bold]-mini" in result.output
