"""How long a backlog takes to be priced and stored, beside live traffic of the same size.

5,000 requests on four engines (the step simulator's continuous batching, 2048-token
chunked prefill, prompts fingerprinted in 64-token blocks), their engine timelines spread
over the 49 minutes before the run: they ended about 1 to 50 minutes before. They reach
the cost attributor in the order they ended, back to back, as an upstream retry queue
replays them after an outage, on the real clock, with the pipeline worker's tick
(``cost.tick_seconds``), the SQLite store's writer thread and the collector's default
pricing settings. Measured: the seconds from the first record handed over until the
last one is stored; of them, the hold after the last record (each unit's last records
wait for it to go quiet: ``min_delay_seconds`` of silence, then its allowed lateness of
wall time); and the records priced late.

Beside it, in the same process: the same records as live traffic, each reaching the
attributor a second after its request ended, on an injected clock (49 minutes of traffic
are not waited out). Its figure is the pricing and storing work (wall seconds) plus the
hold after its last record on its own clock, which a live collector waits out for real:
how long the same records take from the last one's arrival, live. The backlog's seconds
are compared with it. The live run goes before and after the backlog, and the faster
counts (the machines are shared).

    python -m bench.backlog
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tokenpath.collector.cost.attributor import AttributorConfig, CostAttributor
from tokenpath.collector.cost.prices import load_price_sheet
from tokenpath.collector.cost.stepsim import random_workload, simulate
from tokenpath.collector.stats import CollectorStats
from tokenpath.collector.store import RecordStore, StoreConfig
from tokenpath.records import RequestRecord
from tokenpath.roofline import roofline_for

REQUESTS = 5_000
ENGINES = 4
OLDEST_SECONDS = 50 * 60.0
NEWEST_SECONDS = 60.0
LIVE_ARRIVAL_LAG_SECONDS = 1.0
STORE_TIMEOUT_SECONDS = 900.0
GPU = "H100-SXM"
MODEL = "llama-3.1-8b"
PREFIX_BLOCK_TOKENS = 64  # what the engine hooks fingerprint by default


def backlog_records(now: float, requests: int = REQUESTS, engines: int = ENGINES,
                    seed: int = 3) -> list[RequestRecord]:
    """``requests`` on ``engines`` nodes, ending ``NEWEST_SECONDS`` before ``now`` and
    starting about ``OLDEST_SECONDS`` before it, in the order they ended."""
    prices = load_price_sheet()
    roofline = roofline_for(GPU, MODEL)
    per_engine = requests // engines
    rps = per_engine / (OLDEST_SECONDS - NEWEST_SECONDS)
    rng = random.Random(seed)
    out: list[RequestRecord] = []
    for engine in range(engines):
        workload = random_workload(seed + engine, per_engine, rps,
                                   block_tokens=PREFIX_BLOCK_TOKENS)
        result = simulate(workload, roofline,
                          prices.gpus[GPU].dollars_per_second, node=f"backlog-node-{engine}",
                          model=MODEL, prefill_chunk_tokens=2048, record_dispatch=True)
        records = result.records
        offset = now - NEWEST_SECONDS - max(r.engine_end_unix or 0.0 for r in records)
        for record in records:
            record.trace_id = record.record_id = rng.randbytes(16).hex()
            record.prefix_block_tokens = PREFIX_BLOCK_TOKENS
            record.start_unix += offset
            record.end_unix += offset
            for name in ("prefill_start_unix", "decode_start_unix", "engine_end_unix"):
                value = getattr(record, name)
                setattr(record, name, None if value is None else value + offset)
        out.extend(records)
    out.sort(key=lambda r: r.engine_end_unix or 0.0)
    return out


def _shifted(records: list[RequestRecord], offset: float) -> list[RequestRecord]:
    """Copies of ``records`` with every time moved by ``offset``."""
    out = []
    for record in records:
        copy = RequestRecord.from_json(record.to_json())
        copy.start_unix += offset
        copy.end_unix += offset
        for name in ("prefill_start_unix", "decode_start_unix", "engine_end_unix"):
            value = getattr(copy, name)
            setattr(copy, name, None if value is None else value + offset)
        out.append(copy)
    return out


def _wait_stored(store: RecordStore, count: int) -> None:
    deadline = time.monotonic() + STORE_TIMEOUT_SECONDS
    while store.count() < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{store.count()} of {count} records stored")
        time.sleep(0.01)


def _price_and_store(records: list[RequestRecord], store_path: Path, config: AttributorConfig,
                     clock: Callable[[], float], arrive: Callable[[RequestRecord], None],
                     wait_tick: Callable[[float], None]) -> dict[str, Any]:
    """The pipeline worker's part for the attributor, on this thread: each record in
    after ``arrive`` set the clock, a tick each time the clock passes one, then ticks
    until nothing is held; the store writes on its own thread."""
    stats = CollectorStats()
    store = RecordStore(StoreConfig(path=str(store_path)), stats)
    store.start()
    cost = CostAttributor(store, load_price_sheet(), clock=clock, config=config)
    started = time.monotonic()
    cpu = time.process_time()
    next_tick = clock() + config.tick_seconds
    for record in records:
        arrive(record)
        if clock() >= next_tick:
            cost.tick()
            next_tick = clock() + config.tick_seconds
        cost.consume_record(record)
    handed_over = time.monotonic()
    handed_over_clock = clock()
    out_while_arriving = cost.stats.records_out.value
    while cost.pending_records:
        wait_tick(next_tick)
        cost.tick()
        next_tick = clock() + config.tick_seconds
    priced = time.monotonic()
    hold_on_clock = clock() - handed_over_clock
    _wait_stored(store, len(records))
    done = time.monotonic()
    cpu = time.process_time() - cpu
    late = cost.stats.late_records.value
    cost.shutdown()
    return {
        "seconds": done - started,
        "hand_over_seconds": handed_over - started,
        "final_hold_seconds": priced - handed_over,
        # the same hold on the clock the attributor ran on (live: the injected one)
        "final_hold_clock_seconds": hold_on_clock,
        "store_after_priced_seconds": done - priced,
        "cpu_seconds": cpu,
        "records": len(records),
        "records_out_while_arriving": out_while_arriving,
        "late_records": late,
        "late_dollars": cost.stats.late_dollars.value,
        "lateness_seconds": cost.lateness_seconds,
    }


def run_backlog(records: list[RequestRecord], store_path: Path,
                config: AttributorConfig) -> dict[str, Any]:
    """Back to back on the real clock; ticks wait for the real clock too."""
    def wait_tick(at: float) -> None:
        time.sleep(max(0.0, at - time.time()))

    return _price_and_store(records, store_path, config, time.time, lambda _: None,
                            wait_tick)


def run_live(records: list[RequestRecord], store_path: Path,
             config: AttributorConfig) -> dict[str, Any]:
    """Each record a second after its request ended, on an injected clock."""
    now = [min(r.engine_end_unix or 0.0 for r in records)]

    def arrive(record: RequestRecord) -> None:
        now[0] = max(now[0], (record.engine_end_unix or 0.0) + LIVE_ARRIVAL_LAG_SECONDS)

    def wait_tick(at: float) -> None:
        now[0] = max(now[0], at)

    return _price_and_store(records, store_path, config, lambda: now[0], arrive, wait_tick)


def run(requests: int = REQUESTS, min_delay_seconds: float | None = None,
        max_delay_seconds: float | None = None) -> dict[str, Any]:
    """The default pricing settings unless given (a quick run in the tests)."""
    config = AttributorConfig()
    if min_delay_seconds is not None:
        config.min_delay_seconds = min_delay_seconds
    if max_delay_seconds is not None:
        config.max_delay_seconds = max_delay_seconds
    config.validate()
    now = time.time()
    backlog = backlog_records(now, requests)
    # the live copy: the same traffic, ended a second before it is priced
    live = _shifted(backlog, -(NEWEST_SECONDS - LIVE_ARRIVAL_LAG_SECONDS))
    oldest = min(r.engine_end_unix or 0.0 for r in backlog)
    with tempfile.TemporaryDirectory() as tmp:
        # live before and after the backlog (this machine is shared): the faster of the two
        first = run_live(live, Path(tmp) / "live-1.db", config)
        backlog_result = run_backlog(backlog, Path(tmp) / "backlog.db", config)
        second = run_live(_shifted(backlog, -(NEWEST_SECONDS - LIVE_ARRIVAL_LAG_SECONDS)),
                          Path(tmp) / "live-2.db", config)
    live_result = min(first, second, key=lambda r: float(r["seconds"]))
    live_result["seconds_runs"] = [first["seconds"], second["seconds"]]
    # live, from its first record until its last is stored: the work, plus the hold after
    # its last record on its own clock (waited out for real by a live collector)
    live_elapsed = (live_result["seconds"] - live_result["final_hold_seconds"]
                    + live_result["final_hold_clock_seconds"])
    return {
        "requests": len(backlog),
        "engines": ENGINES,
        "oldest_end_minutes": (now - oldest) / 60.0,
        "newest_end_minutes": NEWEST_SECONDS / 60.0,
        "backlog": backlog_result,
        "live": live_result,
        "backlog_seconds": backlog_result["seconds"],
        "backlog_records_per_second": len(backlog) / backlog_result["seconds"],
        "live_seconds": live_elapsed,
        "live_work_seconds": live_result["seconds"],
        "ratio_to_live": backlog_result["seconds"] / live_elapsed,
        "backlog_late_records": backlog_result["late_records"],
        "live_late_records": live_result["late_records"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=REQUESTS)
    args = parser.parse_args()
    print(json.dumps(run(args.requests), indent=2))


if __name__ == "__main__":
    main()
