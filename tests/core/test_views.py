"""The views over a store (tokenpath/views.py: SQL aggregates, rollups, log-bucket
percentiles) against the record-list reference functions on the same records: counts
equal, dollars to 1e-9 relative, percentiles within QUANTILE_RELATIVE_ERROR; and their
memory flat in the number of records."""

from __future__ import annotations

import gc
import math
import random
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.store_workload import synthetic_records
from testkit.oracles import leaks as leak_oracles
from testkit.oracles.chargeback import chargeback
from testkit.oracles.leaks import rank_leaks
from testkit.oracles.report import build_report, percentile
from testkit.oracles.timeseries import timeseries_view
from tokenpath import query, views
from tokenpath.collector.cost.chargeback import IdlePolicy
from tokenpath.collector.store import RecordStore, StoreConfig
from tokenpath.collector.store import sqlite_sql as store_sql
from tokenpath.query import QUANTILE_RELATIVE_ERROR, Window
from tokenpath.records import IdleCost, RequestRecord

END = 1_700_000_000.0 + 1234.5  # not on an hour: windows cut hours
QUANTILE_KEYS = {"p50_seconds", "p95_seconds", "ttft_p50_seconds", "ttft_p95_seconds",
                 "tpot_p50_seconds"}
DOLLARS = 1e-9


def close(a: Any, b: Any, path: str = "", quantiles: frozenset[str] = frozenset()) -> None:
    """``a`` (a view's JSON) matches ``b`` (the reference's): the same shape, counts and
    strings equal, floats to 1e-9 relative, quantiles within the histograms' bound."""
    if isinstance(b, dict):
        assert isinstance(a, dict) and set(a) >= set(b), f"{path}: keys {set(b) - set(a)}"
        for key in b:
            close(a[key], b[key], f"{path}.{key}", quantiles)
    elif isinstance(b, list):
        assert isinstance(a, list) and len(a) == len(b), f"{path}: {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            close(x, y, f"{path}[{i}]", quantiles)
    elif isinstance(b, bool) or b is None or isinstance(b, str):
        assert a == b, f"{path}: {a!r} != {b!r}"
    elif isinstance(b, int) and isinstance(a, int):
        assert a == b, f"{path}: {a} != {b}"
    else:
        assert isinstance(a, int | float), f"{path}: {a!r} != {b!r}"
        name = path.rsplit(".", 1)[-1]
        rel = QUANTILE_RELATIVE_ERROR + 1e-12 if name in quantiles else DOLLARS
        assert a == pytest.approx(b, rel=rel, abs=1e-15), f"{path}: {a!r} != {b!r}"


def write(store: RecordStore, records: list[RequestRecord]) -> None:
    for i in range(0, len(records), 500):
        store._write(list(records[i:i + 500]))


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RecordStore, float]]:
    """A store of 4,000 synthetic records over 6 hours, with idle cost; the rollups hold
    part of them (the writer's run was not due for the last ones)."""
    path = tmp_path_factory.mktemp("views") / "s.db"
    store = RecordStore(StoreConfig(path=str(path), retention_seconds=30 * 86400.0),
                        clock=lambda: END)
    records = list(synthetic_records(4000, END, span_seconds=6 * 3600.0, seed=3))
    write(store, records[:3500])
    store._rolled_at = -math.inf  # a run is due: the rollups take these
    write(store, records[3500:3600])
    store._rolled_at = math.inf  # and not the rest: read from records
    write(store, records[3600:])
    for hour in range(7):
        store._write([IdleCost("pool-a", END - (hour + 1) * 3600, END - hour * 3600,
                               0.5 + hour, 1000.0 * hour)])
    yield store, END
    store.shutdown()


WINDOWS = {"all": Window(), "last 4.5 h": Window(END - 4.5 * 3600),
           "last 20 min": Window(END - 1200), "a span": Window(END - 5 * 3600, END - 2000.5)}


def in_window(records: list[RequestRecord], window: Window) -> list[RequestRecord]:
    return [r for r in records if (window.since_unix is None or r.end_unix >= window.since_unix)
            and (window.until_unix is None or r.end_unix <= window.until_unix)]


@pytest.mark.parametrize("name", list(WINDOWS))
@pytest.mark.parametrize("rollups", [True, False])
def test_the_report_matches_the_reference(filled: tuple[RecordStore, float], name: str,
                                          rollups: bool, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    store, _ = filled
    window = WINDOWS[name]
    if not rollups:
        monkeypatch.setattr(store_sql, "ROLLUP_SIGNATURE", "another version")
    records = in_window(store.records(), window)
    assert records
    since = window.since_unix
    reference = build_report(records, store.idle_cost_dollars(since),
                             store.idle_energy_joules(since))
    report = views.report_view(store, window)
    close(report.to_json(), reference.to_json(), "report", frozenset(QUANTILE_KEYS))
    assert report.to_json()["window"]["quantile_relative_error"] == QUANTILE_RELATIVE_ERROR


@pytest.mark.parametrize("by", ["tenant", "model", "pool"])
@pytest.mark.parametrize("policy", list(IdlePolicy))
def test_chargeback_matches_the_reference(filled: tuple[RecordStore, float], by: str,
                                          policy: IdlePolicy) -> None:
    store, _ = filled
    window = WINDOWS["last 4.5 h"]
    records = in_window(store.records(), window)
    since = window.since_unix
    keys = {"tenant": lambda r: r.tenant, "model": lambda r: r.model, "pool": lambda r: r.pool}
    reference = chargeback(records, store.idle_cost_dollars(since), policy, keys[by],
                           store.idle_energy_joules(since))
    rows = views.chargeback_view(store, window, policy, by)
    close([r.to_json() for r in rows], [r.to_json() for r in reference], "chargeback")
    assert sum(r.total_dollars for r in rows) == pytest.approx(
        sum(r.cost_dollars for r in records) + store.idle_cost_dollars(since), rel=DOLLARS)


@pytest.mark.parametrize("name", ["all", "last 4.5 h"])
def test_the_time_series_matches_the_reference(filled: tuple[RecordStore, float],
                                               name: str) -> None:
    store, _ = filled
    window = WINDOWS[name]
    records = in_window(store.records(), window)
    reference = timeseries_view(records, 24)
    close(views.timeseries_view(store, window, 24), reference, "timeseries",
          frozenset({"ttft_p50_seconds"}))


@pytest.mark.parametrize(("long_context_tokens", "threshold"), [(8192, 0.5), (3000, 0.8)])
def test_the_leaks_match_the_reference(filled: tuple[RecordStore, float],
                                       long_context_tokens: int, threshold: float) -> None:
    store, _ = filled
    window = WINDOWS["last 4.5 h"]
    records = in_window(store.records(), window)
    reference = leak_oracles.leaks_view(records, 10, long_context_tokens,
                                     packets_per_token_threshold=threshold,
                                     network_dollars_per_byte=1e-10)
    view = views.leaks_view(store, window, 10, long_context_tokens,
                            packets_per_token_threshold=threshold,
                            network_dollars_per_byte=1e-10)
    close(view, reference, "leaks")
    assert view["cache"]["replayed"]["records"] == view["cache"]["replayed"]["of"]


def test_the_ranked_leaks_match_the_reference_with_the_routing_replay(
        filled: tuple[RecordStore, float]) -> None:
    store, _ = filled
    window = WINDOWS["all"]
    records = in_window(store.records(), window)
    reference = rank_leaks(records, 1e-10, replay_routing=True)
    ranked = views.rank_leaks_view(store, window, 1e-10, replay_routing=True)
    close([leak.to_json() for leak in ranked], [leak.to_json() for leak in reference],
          "ranked", frozenset({"saving"}))


def test_quantiles_from_buckets_are_within_the_bound() -> None:
    rng = random.Random(5)
    for size in (1, 2, 3, 10, 1000):
        values = [rng.lognormvariate(-4, 2) for _ in range(size)] + [0.0] * (size % 3)
        hist: dict[int, int] = {}
        for v in values:
            key = query.bucket_key(v)
            hist[key] = hist.get(key, 0) + 1
        for q in (0.0, 0.5, 0.95, 0.99, 1.0):
            exact = percentile(values, q)
            assert exact is not None
            assert query.quantile(hist, q) == pytest.approx(
                exact, rel=QUANTILE_RELATIVE_ERROR + 1e-12, abs=1e-300)
    assert query.quantile({}, 0.5) is None
    assert query.bucket_value(query.bucket_key(-2.0)) == pytest.approx(-2.0, rel=0.0101)


def test_the_sql_bucket_is_the_python_bucket(filled: tuple[RecordStore, float]) -> None:
    store, _ = filled
    db = store._reader_db
    rng = random.Random(9)
    for value in [0.0, -1e-9, 1e-300, 1.0, *[rng.lognormvariate(0, 6) for _ in range(2000)]]:
        (key,) = db.execute(f"SELECT {store_sql.bucket_key_sql('?1')}", (value,)).fetchone()
        assert key == query.bucket_key(value), value


def test_a_window_past_the_retention_says_so(tmp_path: Path) -> None:
    store = RecordStore(StoreConfig(path=str(tmp_path / "s.db"), retention_seconds=3600.0),
                        clock=lambda: END)
    try:
        write(store, list(synthetic_records(10, END, span_seconds=600.0)))
        note = views.report_view(store, Window(END - 7200.0)).to_json()["window"]["note"]
        assert note is not None and "keeps 1 h" in note
        assert views.report_view(store, Window(END - 1800.0)).to_json()["window"]["note"] is None
        coverage = store.coverage()
        assert coverage.retention_seconds == 3600.0
        assert coverage.note(Window(END - 7200.0), now=END) is not None
        assert coverage.note(Window(END - 1800.0), now=END) is None
    finally:
        store.shutdown()


def _filled_store(path: Path, records: int) -> RecordStore:
    """``records`` records written directly: a few thousand synthetic ones copied in SQL
    (new ids, end times spread over the day), then the rollups rebuilt."""
    store = RecordStore(StoreConfig(path=str(path), retention_seconds=30 * 86400.0))
    write(store, list(synthetic_records(2500, END, span_seconds=86400.0, seed=11)))
    db = store._db
    columns = ", ".join(c for c in store_sql.L.COLUMNS if c not in ("record_id", "end_unix"))
    copies = records // 2500 - 1
    for k in range(1, copies + 1):
        db.execute(f"INSERT INTO records(record_id, end_unix, {columns}) SELECT "
                   f"record_id || '-c{k}', end_unix - {k * 7.3}, {columns} FROM records "
                   "WHERE record_id NOT LIKE '%-c%'")
    store_sql.rebuild_rollups(db)
    store._rolled_rid = store_sql.rollup_watermark(db)
    return store


def _peak(fn: Any) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_view_s_memory_does_not_grow_with_the_records(tmp_path: Path) -> None:
    n = 20_000
    small = _filled_store(tmp_path / "small.db", n)
    large = _filled_store(tmp_path / "large.db", 4 * n)
    try:
        assert small.count() == n and large.count() == 4 * n
        window = Window(END - 86400.0)
        for view in (lambda s: views.report_view(s, window),
                     lambda s: views.chargeback_view(s, window),
                     lambda s: views.timeseries_view(s, window, 30)):
            view(small), view(large)  # warm: caches filled, names loaded
            peaks = [_peak(lambda s=s, v=view: v(s)) for s in (small, large)]
            assert peaks[1] <= 1.2 * peaks[0], peaks
    finally:
        small.shutdown()
        large.shutdown()
