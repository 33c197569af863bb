"""The read interface on the wire (tokenpath/query_wire.py): histograms and aggregates
read back as written, and a histogram weighs what its buckets span, not what it counts."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenpath.query import Aggregates
from tokenpath.query_wire import (
    WireError,
    aggregates_json,
    histogram_json,
    parse_aggregates,
    parse_histogram,
)

buckets = st.dictionaries(st.integers(-2_000, 2_000), st.integers(1, 10**12), max_size=300)


@given(buckets)
def test_a_histogram_reads_back_as_written(hist: dict[int, int]) -> None:
    assert parse_histogram(json.loads(json.dumps(histogram_json(hist)))) == hist


def test_empty_runs_are_folded() -> None:
    assert histogram_json({5: 2, 6: 1, 10: 7}) == [5, 2, 1, -3, 7]
    assert histogram_json({}) == []
    assert histogram_json({3: 0}) == []  # an empty bucket is no bucket


def test_a_bucket_weighs_its_count_not_its_index() -> None:
    """A latency histogram's buckets sit side by side at indexes in the thousands: each
    travels as its count alone, not as an (index, count) pair."""
    hist = {1_000 + k: 1 + k % 9 for k in range(500)}
    hist.update({2_000 + k: 3 for k in range(0, 100, 7)})  # a sparse tail, gaps folded
    sent = json.dumps(histogram_json(hist))
    as_pairs = json.dumps([[k, c] for k, c in sorted(hist.items())])
    assert len(sent) < len(as_pairs) / 3
    assert len(histogram_json(hist)) == 1 + len(hist) + 15  # the offset, counts, gaps


def test_a_zero_count_does_not_parse() -> None:
    with pytest.raises(ValueError):
        parse_histogram([1, 0])
    body = [[None, {"values": {}, "histograms": {"latency": [1, 2, 0]}, "sets": {}}]]
    with pytest.raises(WireError):
        parse_aggregates(body)


@given(st.dictionaries(st.sampled_from(["n", "cost", "max:ttft"]),
                       st.floats(allow_nan=False, allow_infinity=False)), buckets,
       st.sets(st.text(max_size=8), max_size=5))
def test_aggregates_read_back_as_written(values: dict[str, float], hist: dict[int, int],
                                         models: set[str]) -> None:
    groups = {"tenant-a": Aggregates(values, {"latency": hist}, {"set:models": models})}
    back = parse_aggregates(json.loads(json.dumps(aggregates_json(groups))))
    assert back["tenant-a"].values == values
    assert back["tenant-a"].histograms == {"latency": hist}
    assert back["tenant-a"].sets == {"set:models": models}
