"""Idle cost rows (collector/cost/attributor.py merge_idle_spans): contiguous idle spans of one
close are merged only while their rate is the same, so every row's idle is spread evenly
over its time and a query over part of a row is exact, however the ticks cut it."""

from __future__ import annotations

import math

from tokenpath.collector.cost.attributor import merge_idle_spans
from tokenpath.records import IdleCost

# (start, end, dollars, joules): a partly idle second of a busy engine, then wholly idle
PARTLY_IDLE = [(0.0, 1.0, 0.2, 20.0), (1.0, 2.0, 0.2, 20.0)]
WHOLLY_IDLE = [(2.0, 3.0, 1.0, 100.0), (3.0, 5.0, 2.0, 200.0)]


def _pro_rata(rows: list[IdleCost], start: float, end: float) -> float:
    return sum(r.dollars * max(0.0, min(r.end_unix, end) - max(r.start_unix, start))
               / (r.end_unix - r.start_unix) for r in rows)


def test_spans_of_one_rate_merge_and_of_another_start_a_row() -> None:
    rows = merge_idle_spans("pool", [*PARTLY_IDLE, *WHOLLY_IDLE])
    assert [(r.start_unix, r.end_unix) for r in rows] == [(0.0, 2.0), (2.0, 5.0)]
    assert [r.dollars for r in rows] == [0.4, 3.0]
    assert [r.energy_joules for r in rows] == [40.0, 300.0]


def test_a_window_over_part_of_the_rows_prices_as_the_spans_do() -> None:
    spans = [*PARTLY_IDLE, *WHOLLY_IDLE]
    as_spans = [IdleCost("pool", a, b, d, j) for a, b, d, j in spans]
    rows = merge_idle_spans("pool", spans)
    for start, end in ((0.5, 2.5), (1.5, 4.0), (0.0, 5.0), (2.5, 2.75)):
        assert math.isclose(_pro_rata(rows, start, end), _pro_rata(as_spans, start, end))


def test_a_gap_or_a_joules_rate_change_starts_a_row() -> None:
    rows = merge_idle_spans("pool", [(0.0, 1.0, 1.0, 10.0), (2.0, 3.0, 1.0, 10.0),
                                (3.0, 4.0, 1.0, 50.0)])
    assert len(rows) == 3
