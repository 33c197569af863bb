"""The ClickHouse store on chDB: ``tokenpath report --since 24h`` and ``tokenpath chargeback
--since 24h`` (wall seconds and peak RSS of a fresh interpreter, chDB's start included) over
a day of 1M and 10M records, bytes per record on disk, and the writer's rate.

The records (bench/store_workload.py) are written as a collector writes them, through
``ClickHouseStore``'s sender, for the first ``DISTINCT``; the engine then copies those rows
(``INSERT ... SELECT`` with new record ids and end times spread over the day) up to each
size: making 10M records in Python would take most of an hour and measure nothing of the
store. The rollups' materialized views add the copies as they are inserted, as they add
a collector's batches, so the views read the same rollups either way.

The CLI runs as a user runs it from an installed wheel: its modules' bytecode compiled (pip
compiles it at install; a first run writes it here), on a store in its steady state: the
parts the bench's one large ``OPTIMIZE`` replaced are removed before the CLI starts (a
server keeps them 8 minutes, and chDB loads every part at start, so the first minutes after
a bulk merge of 10M records cost over a second more). Each command runs ``RUNS`` times in a
fresh interpreter; the figure is their median.

The baseline, run side by side on the same records: the same commands at 1M, so the ratio
10M / 1M says how the views scale with the records they read.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from bench.store import DAY, run_command
from bench.store_workload import synthetic_records
from tokenpath import views
from tokenpath.collector.cost.chargeback import IdlePolicy
from tokenpath.collector.store import StoreConfig
from tokenpath.collector.store import layout as L
from tokenpath.collector.store.clickhouse import ClickHouseStore
from tokenpath.query import Window
from tokenpath.records import IdleCost

DISTINCT = 20_000
COPY_CHUNK = 1_000_000  # rows per INSERT ... SELECT
RUNS = 3  # fresh CLI processes per command
REPLACED_PARTS_WAIT = 900.0  # seconds at most for the replaced parts to be removed
# the cleanup that removes them: at once, and polling every second (not backing off to 5 min)
CLEANUP_SETTINGS = {"old_parts_lifetime": 1, "cleanup_delay_period": 1,
                    "max_cleanup_delay_period": 1, "cleanup_delay_period_random_add": 0}


def _write_distinct(store: ClickHouseStore, now: float) -> dict[str, float]:
    records = list(synthetic_records(DISTINCT, now, DAY))
    started = time.perf_counter()
    store.start()
    for record in records:
        store.consume_record(record)
    for h in range(144):
        store.consume_idle_cost(IdleCost("pool-a", now - (h + 1) * 600, now - h * 600,
                                         0.02, 300.0))
    store.flush()
    seconds = time.perf_counter() - started
    return {"records": DISTINCT, "write_seconds": round(seconds, 2),
            "records_per_second": round(DISTINCT / seconds)}


def _grow(store: ClickHouseStore, have: int, want: int, now: float) -> int:
    """Copies of the distinct rows until the table holds ``want``: copy k of row i ends at
    a time of its own within the day, under an id of its own."""
    columns = ", ".join(f"`{c}`" for c in L.COLUMNS)
    conn = store._conn
    while have < want:
        copies = max(1, min(COPY_CHUNK, want - have) // DISTINCT)
        first = have // DISTINCT
        conn.command(
            f"INSERT INTO records ({columns}) SELECT base.* REPLACE ("
            f"concat(base.record_id, '-', toString(copy.number)) AS record_id, "
            f"{now} - modulo(({now} - base.end_unix) + copy.number * 4.3196, {DAY}) AS end_unix) "
            f"FROM (SELECT {columns} FROM records WHERE position(record_id, '-') = 0) AS base "
            f"CROSS JOIN numbers({first}, {copies}) AS copy "
            f"SETTINGS max_insert_threads = 2")
        have += copies * DISTINCT
    return have


def _optimize(store: ClickHouseStore) -> float:
    """One part per partition, and the parts it replaced gone (the store's steady state):
    they are kept ``old_parts_lifetime`` after a merge and removed by a cleanup that runs
    every 30 s to 5 min; the bench has it remove them at once for this merge alone, and
    waits, by condition, until it has."""
    conn = store._conn
    settings = ", ".join(f"{k} = {v}" for k, v in CLEANUP_SETTINGS.items())
    conn.command(f"ALTER TABLE records MODIFY SETTING {settings}")
    conn.command("OPTIMIZE TABLE records FINAL")
    merged = time.monotonic()
    deadline = merged + REPLACED_PARTS_WAIT
    while conn.rows("SELECT count() FROM system.parts WHERE database = currentDatabase() "
                    "AND table = 'records' AND NOT active")[0][0]:
        if time.monotonic() > deadline:
            raise RuntimeError("the parts OPTIMIZE replaced were not removed in "
                               f"{REPLACED_PARTS_WAIT:.0f} s")
        time.sleep(1.0)
    conn.command(f"ALTER TABLE records RESET SETTING {', '.join(CLEANUP_SETTINGS)}")
    return round(time.monotonic() - merged, 1)


def _cli_runs(argv: list[str]) -> dict[str, Any]:
    """``RUNS`` fresh interpreters after one that writes the modules' bytecode (as pip
    does at install): the median's wall seconds and peak RSS, and the spread."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    run_command(argv, env=env)  # compiles the bytecode; not counted
    runs = [run_command(argv, env=env) for _ in range(RUNS)]
    middle = sorted(runs, key=lambda r: float(r["seconds"]))[len(runs) // 2]
    return {**middle, "runs_seconds": [r["seconds"] for r in runs],
            "median_of": len(runs),
            "spread_seconds": round(statistics.pstdev(float(r["seconds"]) for r in runs), 3)}


def _bytes_per_record(store: ClickHouseStore) -> float:
    ((size, rows),) = store._conn.rows(
        "SELECT sum(bytes_on_disk), sum(rows) FROM system.parts WHERE active "
        "AND database = currentDatabase() AND table = 'records'")
    return round(float(size) / max(1, int(rows)), 1)


def _views_in_open_store(store: ClickHouseStore, repeats: int = 3) -> dict[str, float]:
    """The report and chargeback views in the process that holds the store open, as a
    running collector answers ``/api/summary``, the UI and ``tokenpath report --collector``
    (a chDB folder is read through its collector): the first call, its columns' marks
    cold, and the best of ``repeats``."""
    out: dict[str, float] = {}
    for name, view in (("report", lambda w: views.report_view(store, w)),
                       ("chargeback", lambda w: views.chargeback_view(
                           store, w, IdlePolicy.PROPORTIONAL, "tenant"))):
        times = []
        for _ in range(repeats):
            window = Window(since_unix=time.time() - DAY)
            started = time.perf_counter()
            view(window)
            times.append(time.perf_counter() - started)
        out[f"{name}_first_seconds"] = round(times[0], 3)
        out[f"{name}_best_seconds"] = round(min(times), 3)
    return out


def run(sizes: tuple[int, ...] = (1_000_000, 10_000_000)) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tokenpath-chdb-bench-",
                                     ignore_cleanup_errors=True) as tmp:
        url = f"chdb://{tmp}/store"
        now = time.time()
        store = ClickHouseStore(StoreConfig(path=url, retention_seconds=7 * DAY))
        out["writer"] = _write_distinct(store, now)
        have = DISTINCT
        cli = [sys.executable, "-m", "tokenpath.cli.main"]
        for size in sizes:
            started = time.perf_counter()
            have = _grow(store, have, size, now)
            removed_after = _optimize(store)
            figures: dict[str, Any] = {"records": have,
                                       "replaced_parts_removed_after_seconds": removed_after,
                                       "grow_seconds": round(time.perf_counter() - started, 1),
                                       "bytes_per_record": _bytes_per_record(store)}
            store.shutdown()  # the CLI opens the folder itself (one process at a time)
            for name in ("report", "chargeback"):
                figures[name] = _cli_runs([*cli, name, "--store", url, "--since", "24h",
                                           "--format", "json"])
            store = ClickHouseStore(StoreConfig(path=url, retention_seconds=7 * DAY))
            figures["open_store"] = _views_in_open_store(store)
            out[str(size)] = figures
        store.shutdown()
    small, large = (out[str(s)] for s in (min(sizes), max(sizes)))
    out["summary"] = {
        "records": large["records"],
        "report_seconds": large["report"]["seconds"],
        "chargeback_seconds": large["chargeback"]["seconds"],
        "report_peak_rss_mb": large["report"]["peak_rss_mb"],
        "chargeback_peak_rss_mb": large["chargeback"]["peak_rss_mb"],
        "report_ratio_to_smaller": round(large["report"]["seconds"]
                                         / small["report"]["seconds"], 2),
        "bytes_per_record": large["bytes_per_record"],
        "writer_records_per_second": out["writer"]["records_per_second"],
        "open_store_report_first_seconds": large["open_store"]["report_first_seconds"],
        "open_store_report_best_seconds": large["open_store"]["report_best_seconds"],
        "open_store_chargeback_best_seconds": large["open_store"]["chargeback_best_seconds"],
    }
    return out


if __name__ == "__main__":
    sizes = tuple(int(a) for a in sys.argv[1:]) or (1_000_000, 10_000_000)
    print(json.dumps(run(sizes), indent=2))
