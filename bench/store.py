"""The store: records written per second, bytes per record on disk, and ``tokenpath report
--since 24h`` and ``tokenpath chargeback --since 24h`` (wall seconds and the process's peak
RSS) over stores of 100k and 1M records, beside the code before the column layout.

Records (bench/store_workload.py: about 4.3 KB of JSON each) are written as the writer
thread writes them (``RecordStore._write`` in batches of the default batch size, rollup
runs included), a few thousand distinct records given new ids and end times so that making
them costs little beside writing them. The writer's rate is measured on a stream whose
records end 10,000 a second (a live collector's: a rollup run spans a second or two of end
times), and again while filling the 100k and 1M stores, whose records end evenly over the
last day (a day's traffic written in seconds: each rollup run spans hours of end times).
Each command runs in a fresh interpreter; its peak RSS is the child's ``ru_maxrss``.

The baseline is the code before: the JSON layout (a body per record in ``requests``) and
the views over every record of the window loaded into Python (``RecordStore.records`` then
``build_report`` and ``rank_leaks``, or ``chargeback``: testkit/oracles), run by
bench/store_baseline.py. It runs at 100k only: at 1M it took minutes and about 13 GB (the
issue's figures).
"""

from __future__ import annotations

import itertools
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.peak_rss import PEAK_FILE_ENV
from bench.store_baseline import encode_body
from bench.store_workload import synthetic_records
from tokenpath.collector.store import RecordStore, StoreConfig
from tokenpath.collector.store.sqlite import DEFAULT_BATCH_SIZE
from tokenpath.records import RequestRecord

DISTINCT = 5_000
DAY = 86_400.0
LEGACY_SCHEMA = """
CREATE TABLE requests (trace_id TEXT PRIMARY KEY, end_unix REAL NOT NULL, model TEXT NOT NULL,
                       complete INTEGER NOT NULL, body TEXT NOT NULL);
CREATE INDEX requests_end ON requests(end_unix);
CREATE TABLE idle_cost (pool TEXT NOT NULL, start_unix REAL NOT NULL, end_unix REAL NOT NULL,
                        dollars REAL NOT NULL, energy_joules REAL NOT NULL DEFAULT 0);
CREATE INDEX idle_cost_end ON idle_cost(end_unix);
CREATE TABLE joined_traces (trace_id TEXT NOT NULL, record_id TEXT NOT NULL,
                            end_unix REAL NOT NULL);
"""


def _records(count: int, now: float, span: float = DAY) -> Any:
    """``count`` records ending evenly over the ``span`` seconds before ``now``: DISTINCT
    made ones, each reused with a new trace id and end time."""
    base = list(synthetic_records(min(DISTINCT, count), now, span))
    step = span / count
    for i in range(count):
        r = base[i % len(base)]
        duration = r.end_unix - r.start_unix
        r.trace_id = r.record_id = format(i * 0x9E3779B97F4A7C15 % (1 << 128) | 1 << 127, "032x")
        r.end_unix = now - span + (i + 1) * step
        r.start_unix = r.end_unix - duration
        yield r


def _idle(now: float) -> list[tuple[str, float, float, float, float]]:
    return [("pool-a", now - (h + 1) * 600, now - h * 600, 0.02, 300.0) for h in range(144)]


def write_store(path: Path, count: int, now: float, span: float = DAY) -> dict[str, float]:
    """Write ``count`` records ending over ``span`` seconds; the writer's rate."""
    store = RecordStore(StoreConfig(path=str(path), retention_seconds=7 * DAY))
    batch: list[RequestRecord] = []
    records = _records(count, now, span)
    first = next(records)  # the distinct records are made before the clock starts
    started, cpu = time.perf_counter(), time.process_time()
    for record in itertools.chain([first], records):
        batch.append(record)
        if len(batch) >= DEFAULT_BATCH_SIZE:
            store._write(batch)
            batch = []
    if batch:
        store._write(batch)
    store.shutdown()  # its last rollup run included
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu
    db = sqlite3.connect(path, isolation_level=None)
    db.executemany("INSERT INTO idle_cost VALUES (?, ?, ?, ?, ?)", _idle(now))
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return {"records": count, "write_seconds": round(seconds, 2),
            "records_per_second": round(count / seconds),
            "records_per_cpu_second": round(count / cpu),
            "bytes_per_record": round(path.stat().st_size / count, 1)}


def write_legacy_store(path: Path, count: int, now: float) -> dict[str, float]:
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.executescript(LEGACY_SCHEMA)
        rows = []
        for r in _records(count, now):
            rows.append((r.record_id, r.end_unix, r.model, int(r.complete), encode_body(r)))
            if len(rows) >= 10_000:
                db.executemany("INSERT INTO requests VALUES (?, ?, ?, ?, ?)", rows)
                rows = []
        db.executemany("INSERT INTO requests VALUES (?, ?, ?, ?, ?)", rows)
        db.executemany("INSERT INTO idle_cost VALUES (?, ?, ?, ?, ?)", _idle(now))
        db.commit()
    db.close()
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return {"bytes_per_record": round(path.stat().st_size / count, 1)}


def run_command(argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Wall seconds and peak RSS of one command (``python -m MODULE ...``) in a fresh
    interpreter; the peak is the child's own (bench/peak_rss.py), not what ``ru_maxrss``
    reports for a child of this (large) process."""
    assert argv[1] == "-m", argv
    with tempfile.NamedTemporaryFile("r", suffix=".peak") as peak:
        env = {**(os.environ if env is None else env), PEAK_FILE_ENV: peak.name}
        started = time.perf_counter()
        done = subprocess.run([argv[0], "-m", "bench.peak_rss", *argv[2:]],
                              capture_output=True, env=env)
        seconds = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.decode()[-2000:]}")
        peak_mib = float(peak.read() or 0.0)
    result: dict[str, Any] = {"seconds": round(seconds, 2), "peak_rss_mb": round(peak_mib, 1)}
    data = json.loads(done.stdout)
    result["requests"] = (data["requests"] if isinstance(data, dict) and "requests" in data
                          else sum(r["requests"] for r in data["rows"]))
    return result


def _commands(path: Path) -> dict[str, list[str]]:
    cli = [sys.executable, "-m", "tokenpath.cli.main"]
    return {"report": [*cli, "report", "--store", str(path), "--since", "24h", "--format",
                       "json"],
            "chargeback": [*cli, "chargeback", "--store", str(path), "--since", "24h",
                           "--format", "json"]}


STREAM_RECORDS = 200_000
STREAM_RATE = 10_000.0  # records ending per second of the stream written


def run(sizes: tuple[int, ...] = (100_000, 1_000_000), baseline_at: int = 100_000,
        stream: int = STREAM_RECORDS) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tokenpath-store-bench-") as tmp:
        # The writer on a live stream: records end as fast as the target rate writes them
        # (a rollup run spans a second or two of end times).
        path = Path(tmp) / "stream.db"
        out["stream"] = write_store(path, stream, time.time(), stream / STREAM_RATE)
        path.unlink()
        for count in sizes:
            now = time.time()
            path = Path(tmp) / f"store-{count}.db"
            figures: dict[str, Any] = write_store(path, count, now)
            for name, argv in _commands(path).items():
                figures[name] = run_command(argv)
            out[str(count)] = figures
            path.unlink()
            if count == baseline_at:
                legacy = Path(tmp) / f"legacy-{count}.db"
                baseline: dict[str, Any] = write_legacy_store(legacy, count, time.time())
                for name in ("report", "chargeback"):
                    baseline[name] = run_command([sys.executable, "-m", "bench.store_baseline",
                                                  name, str(legacy)])
                out[f"baseline_{count}"] = baseline
                legacy.unlink()
    largest = str(max(sizes))
    out["summary"] = {
        "records_per_second": out["stream"]["records_per_second"],
        "records_per_cpu_second": out["stream"]["records_per_cpu_second"],
        "fill_records_per_second": out[largest]["records_per_second"],
        "bytes_per_record": out[largest]["bytes_per_record"],
        "report_seconds": out[largest]["report"]["seconds"],
        "report_peak_rss_mb": out[largest]["report"]["peak_rss_mb"],
        "chargeback_seconds": out[largest]["chargeback"]["seconds"],
        "chargeback_peak_rss_mb": out[largest]["chargeback"]["peak_rss_mb"],
        "records": int(largest),
    }
    return out


if __name__ == "__main__":
    sizes = tuple(int(a) for a in sys.argv[1:]) or (100_000, 1_000_000)
    print(json.dumps(run(sizes, baseline_at=min(sizes)), indent=2))
