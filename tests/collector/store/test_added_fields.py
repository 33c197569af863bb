"""A store written before a record field existed: the collector adds the field's column at
open and keeps writing; older rows read back with the field's default."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tokenpath.collector.store import RecordStore, StoreConfig
from tokenpath.records import RequestRecord

NEW_FIELDS = ("prefill_engine_id", "prefill_node", "decode_engine_id", "decode_node",
              "kv_transfer_tokens", "kv_transfer_bytes", "kv_transfer_source")


def test_a_store_without_the_new_columns_gains_them_and_reads_old_rows(
        tmp_path: Path) -> None:
    path = str(tmp_path / "s.db")
    now = 1_000_000.0
    old = RequestRecord(trace_id=format(1, "032x"), model="m", start_unix=now - 2,
                        end_unix=now - 1)
    store = RecordStore(StoreConfig(path=path), clock=lambda: now)
    store.start()
    store.consume_record(old)
    store.shutdown()
    db = sqlite3.connect(path)
    for name in NEW_FIELDS:  # as an earlier version laid the table out
        db.execute(f"ALTER TABLE records DROP COLUMN {name}")
    db.commit()
    db.close()

    new = RequestRecord(trace_id=format(2, "032x"), model="m", start_unix=now - 1,
                        end_unix=now, prefill_engine_id="prefill-0", prefill_node="n1",
                        decode_engine_id="decode-0", decode_node="n2",
                        kv_transfer_tokens=3999, kv_transfer_bytes=523_000_000,
                        kv_transfer_source="derived")
    reopened = RecordStore(StoreConfig(path=path), clock=lambda: now)
    reopened.start()
    reopened.consume_record(new)
    reopened.shutdown()
    reader = RecordStore(StoreConfig(path=path), clock=lambda: now)
    try:
        assert reader.record(new.record_id) == new
        assert reader.record(old.record_id) == old
    finally:
        reader.shutdown()
