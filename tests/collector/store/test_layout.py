"""The record row (collector/store/layout.py): every field back as it was written, whatever
its shape; the columns follow the field table."""

from __future__ import annotations

import sqlite3

from bench.store_workload import synthetic_records
from tokenpath import record_fields
from tokenpath.collector.store import layout as L
from tokenpath.records import PhaseShare, RequestRecord, StageTiming
from tokenpath.stages import STAGE_IDS, Phase, Provenance


def _round_trip(records: list[RequestRecord]) -> list[RequestRecord]:
    db = sqlite3.connect(":memory:", isolation_level=None)
    db.executescript(L.schema_sql())
    encoder = L.RowEncoder(L.Names())
    db.executemany(L.INSERT_SQL, [encoder.encode(db, r) for r in records])
    rows = db.execute(f"SELECT {L.SELECT_COLUMNS} FROM records ORDER BY rid").fetchall()
    decoder = L.RowDecoder(L.Names())  # a reader's: it loads the names as it meets them
    return [decoder.decode(db, row) for row in rows]


def test_synthetic_records_read_back_equal() -> None:
    records = list(synthetic_records(300, 1_700_000_000.0, seed=2))
    assert _round_trip(records) == records


def test_odd_shapes_read_back_equal() -> None:
    odd = RequestRecord(trace_id="t-1", record_id="not-derived", model="m", tenant="",
                        prefix_fingerprints=("ABC", "xyz!", "0011"), joined_trace_ids=("a" * 32,),
                        miss_tokens={"cold": 0, "a cause from elsewhere": 5},
                        miss_dollars={"evicted": 0.25, "a cause from elsewhere": 0.5},
                        gpu_inventory=False, engine_steps=0, ttft_seconds=0.0)
    every = RequestRecord(trace_id="b" * 32, record_id="b" * 32 + "-" + "c" * 16)
    for i, stage in enumerate(STAGE_IDS):
        timing = StageTiming(stage, 0.1 * i, list(Provenance)[i % 3], 0.01 * i)
        for phase in Phase:
            timing.phases[phase] = PhaseShare(0.001 * i, 0.0)
        every.stages[stage] = timing
    plain = RequestRecord(trace_id="c" * 32)
    assert _round_trip([odd, every, plain]) == [odd, every, plain]


def test_non_finite_figures_are_stored_as_null() -> None:
    r = RequestRecord(trace_id="d" * 32, cost_dollars=float("inf"), ttft_seconds=float("nan"),
                      energy_joules=float("-inf"))
    r.stages[STAGE_IDS[0]] = StageTiming(STAGE_IDS[0], float("nan"), Provenance.MEASURED)
    (back,) = _round_trip([r])
    assert (back.cost_dollars, back.ttft_seconds, back.energy_joules) == (0.0, None, 0.0)
    assert back.stages[STAGE_IDS[0]].seconds == 0.0


def test_the_columns_follow_the_field_table() -> None:
    columns = set(L.COLUMNS)
    for f in record_fields.FIELDS:
        if f.storage in (record_fields.COLUMN, record_fields.NAME, record_fields.LIST):
            assert f.name in columns, f.name
    assert {f"s_{s.value}" for s in STAGE_IDS} <= columns
    assert len(L.COLUMNS) == len(set(L.COLUMNS))


def test_lists_pack_to_raw_bytes_when_they_are_hex() -> None:
    fingerprints = tuple(format(i, "016x") for i in range(64))
    packed = L.pack_list(fingerprints)
    assert packed is not None and len(packed) == 2 + 8 * 64
    assert L.unpack_list(packed) == fingerprints
    assert L.unpack_list(L.pack_list(("Ab", "cd"))) == ("Ab", "cd")
    assert L.pack_list(()) is None and L.unpack_list(None) == ()
