"""`make bench`: every benchmark of docs/performance.md, printed as a table of ratios and the
absolute figures behind them, and written as JSON (bench/results/latest.json).

Each figure is measured against a baseline in the same run: these machines are shared
and noisy, so absolute times drift while ratios hold.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.table import Table


@dataclass(frozen=True)
class Target:
    """One line of the table: where the figure is in a bench's result and its target."""

    bench: str
    label: str
    path: tuple[str, ...]
    op: str  # "<=" or ">="
    limit: float
    unit: str = ""
    # Figures measured beside this one that explain it: (label, path in the result, unit).
    beside: tuple[tuple[str, tuple[str, ...], str], ...] = ()

    def value(self, results: dict[str, Any],
              path: tuple[str, ...] | None = None) -> float | None:
        node: Any = results.get(self.bench)
        for key in self.path if path is None else path:
            if not isinstance(node, dict) or key not in node:
                return None
            node = node[key]
        return float(node) if isinstance(node, int | float) else None

    def beside_text(self, results: dict[str, Any]) -> str:
        parts = []
        for label, path, unit in self.beside:
            value = self.value(results, path)
            if value is not None:
                parts.append(f"{label} {value:,.4g} {unit}".rstrip())
        return "; ".join(parts)

    def holds(self, value: float) -> bool:
        return value <= self.limit if self.op == "<=" else value >= self.limit


# bench name -> (module, function, keyword arguments for a quick run)
BENCHES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "ingest": ("bench.ingest", "run", {"requests": 300}),
    "memory": ("bench.memory", "run", {}),
    "overload": ("bench.overload", "run", {}),
    "scrape": ("bench.scrape", "run", {}),
    "stage_recording": ("bench.stage_recording", "run", {}),
    "agent": ("bench.agent_bench", "run", {}),
    "attribution": ("bench.attribution", "run", {}),
    "hash_flood": ("bench.hash_flood", "run", {}),
    "backlog": ("bench.backlog", "run", {}),
    "pricing_scale": ("bench.pricing_scale", "run", {}),
    "store": ("bench.store", "run", {}),
    "store_clickhouse": ("bench.store_clickhouse", "run", {}),
    "remote_report": ("bench.remote_report", "run", {}),
    "no_loss": ("bench.no_loss", "run", {"requests": 2_000}),
    "kv_events": ("bench.kv_events", "run", {}),
}

TARGETS = (
    Target("ingest", "ingest path CPU/span vs parse floor", ("ingest_path", "ratio_to_floor"),
           "<=", 2.0, "x",
           beside=(("reference decoder", ("ingest_path_reference_decoder", "ratio_to_floor"),
                    "x"),)),
    Target("ingest", "ingest path spans/s per core", ("ingest_path", "spans_per_core_second"),
           ">=", 50_000),
    Target("ingest", "15-stage traces: whole collector CPU/span vs floor, OTLP/HTTP",
           ("http", "ratio_to_floor"), "<=", 3.0, "x",
           beside=(("net of idle", ("http", "cpu_us_per_span_net_of_idle"), "µs/span"),
                   ("idle", ("http", "idle_cpu_percent_of_core"), "% of a core"),
                   ("reference decoder", ("http_reference_decoder", "ratio_to_floor"), "x"),
                   ("pure-Python core", ("http_pure_python_core", "ratio_to_floor"), "x"))),
    Target("ingest", "15-stage traces: whole collector CPU/span vs floor, OTLP/gRPC",
           ("grpc", "ratio_to_floor"), "<=", 3.0, "x",
           beside=(("net of idle", ("grpc", "cpu_us_per_span_net_of_idle"), "µs/span"),
                   ("idle", ("grpc", "idle_cpu_percent_of_core"), "% of a core"))),
    Target("ingest", "15-stage traces: whole collector spans/s per core, OTLP/HTTP",
           ("http", "spans_per_core_second"), ">=", 50_000),
    Target("ingest", "15-stage traces: whole collector spans/s per core, OTLP/gRPC",
           ("grpc", "spans_per_core_second"), ">=", 50_000),
    Target("ingest", "reference-path traces: whole collector CPU/span vs floor, OTLP/HTTP",
           ("shapes", "reference_path", "http", "ratio_to_floor"), "<=", 3.0, "x",
           beside=(("net of idle", ("shapes", "reference_path", "http",
                                    "cpu_us_per_span_net_of_idle"), "µs/span"),
                   ("reference decoder", ("shapes", "reference_path", "http_reference_decoder",
                                          "ratio_to_floor"), "x"),
                   ("pure-Python core", ("shapes", "reference_path", "http_pure_python_core",
                                         "ratio_to_floor"), "x"))),
    Target("ingest", "reference-path traces: whole collector CPU/span vs floor, OTLP/gRPC",
           ("shapes", "reference_path", "grpc", "ratio_to_floor"), "<=", 3.0, "x"),
    Target("ingest", "reference-path traces: whole collector spans/s per core, OTLP/HTTP",
           ("shapes", "reference_path", "http", "spans_per_core_second"), ">=", 50_000,
           beside=(("CPU a request (3 spans, 13 stage events)",
                    ("shapes", "reference_path", "http", "cpu_us_per_request"), "µs"),
                   ("pure-Python core", ("shapes", "reference_path", "http_pure_python_core",
                                         "cpu_us_per_request"), "µs"))),
    Target("ingest", "reference-path traces: whole collector spans/s per core, OTLP/gRPC",
           ("shapes", "reference_path", "grpc", "spans_per_core_second"), ">=", 50_000),
    Target("memory", "retained bytes per buffered span", ("bytes_per_buffered_span",),
           "<=", 500, "B"),
    Target("overload", "RSS growth under 2x overload", ("rss_growth_ratio",), "<=", 1.5, "x"),
    Target("scrape", "/metrics scrape, 10k series", ("scrape_ms_median",), "<=", 20, "ms"),
    Target("stage_recording", "hook API vs OTel span per stage", ("ratio",), "<=", 0.25, "x"),
    Target("stage_recording", "gateway req/s instrumented vs not", ("gateway_ratio",),
           ">=", 0.9, "x",
           beside=(("median of the rounds' own ratios",
                    ("gateway_throughput", "median_round_ratio"), "x"),
                   ("both with the stock OTLP/HTTP exporter",
                    ("gateway_throughput", "stock_export_ratio"), "x"),
                   ("the shim's gateway, tokenpath's exporter over the stock one",
                    ("gateway_throughput", "exporter_speedup"), "x"),
                   ("both dropping spans unencoded (the runs before the seventh)",
                    ("gateway_throughput", "no_export_ratio"), "x"),
                   ("OpenTelemetry's FastAPI instrumentation instead",
                    ("gateway_throughput", "otel_fastapi_ratio"), "x"),
                   ("garbage collection, % of the CPU with the shim",
                    ("gateway_throughput", "instrumented_gc_percent_of_cpu"), "%"),
                   ("and without it",
                    ("gateway_throughput", "plain_gc_percent_of_cpu"), "%"))),
    Target("agent", "agent CPU share at 1 Hz", ("cpu_percent_of_core",), "<=", 0.5, "%",
           beside=(("raw calls alone", ("cpu_percent_of_core_raw_calls_1hz",), "%"),
                   ("idle wake alone", ("cpu_percent_of_core_idle_wake_1hz",), "%"),
                   ("page touched after 1 s asleep vs back to back",
                    ("wake_penalty_ratio",), "x"))),
    Target("agent", "agent poll vs raw calls (pynvml, fake driver)", ("poll_ratio",),
           "<=", 1.5, "x"),
    Target("attribution", "median error vs ground truth", ("median_rel_error",), "<=", 0.05),
    Target("attribution", "error vs naive wall-clock error", ("error_ratio_to_naive",),
           "<=", 0.1, "x"),
    Target("attribution", "attribution CPU/request, 1,024 vs 16 in flight",
           ("in_flight", "ratio_1024_to_16"), "<=", 1.5, "x",
           beside=(("at 16", ("in_flight", "cpu_us_per_request_16"), "µs"),
                   ("at 1,024", ("in_flight", "cpu_us_per_request_1024"), "µs"))),
    Target("backlog", "5,000-request backlog (1-50 min old, in time order): priced and "
           "stored, vs the same traffic live (its work plus its hold after the last record)",
           ("ratio_to_live",), "<=", 1.5, "x",
           beside=(("backlog", ("backlog_seconds",), "s"),
                   ("of which the hold after the last record (quiet units)",
                    ("backlog", "final_hold_seconds"), "s"),
                   ("live", ("live_seconds",), "s"),
                   ("live work alone", ("live_work_seconds",), "s"),
                   ("backlog", ("backlog_records_per_second",), "records/s"))),
    Target("pricing_scale", "pricing CPU/request, 3,000 models in flight on one node vs one "
           "model (a fresh collector each)", ("cpu_ratio_3000_to_1",), "<=", 2.0, "x",
           beside=(("one model", ("cpu_us_per_request_1_model",), "µs"),
                   ("3,000 models", ("cpu_us_per_request_3000_models",), "µs"))),
    Target("pricing_scale", "slowest /metrics answer while a 3,000-model burst is priced",
           ("burst_slowest_metrics_seconds",), "<=", 1.0, "s",
           beside=(("one model", ("burst_1_model_slowest_metrics_seconds",), "s"),)),
    Target("pricing_scale", "slowest /metrics answer while a 100,000-request backlog is priced",
           ("backlog_slowest_metrics_seconds",), "<=", 1.0, "s",
           beside=(("its requests/s", ("backlog", "requests_per_second"), ""),)),
    Target("backlog", "records priced late in that backlog", ("backlog_late_records",),
           "<=", 0, "",
           beside=(("live", ("live_late_records",), ""),)),
    Target("no_loss", "300,000 vLLM-shaped requests into a collector as fast as it accepts "
           "(429s honoured): records dropped", ("dropped",), "<=", 0, "",
           beside=(("stored", ("stored",), ""), ("accepted", ("accepted",), ""),
                   ("429s answered", ("refused_429",), ""),
                   ("accepted", ("accepted_per_second",), "/s"))),
    Target("store", "store: records written per second (rollups included)",
           ("summary", "records_per_second"), ">=", 10_000,
           beside=(("per CPU second of the writer", ("summary", "records_per_cpu_second"), ""),
                   ("filling the 1M store", ("summary", "fill_records_per_second"), "/s"))),
    Target("remote_report", "report --collector, one collector of 1M records",
           ("summary", "collector_seconds"), "<=", 5.0, "s",
           beside=(("--store on the same file", ("summary", "store_seconds"), "s"),
                   ("three replicas of a third each", ("summary", "replicas_seconds"), "s"))),
    Target("remote_report", "report --collector peak RSS, one collector of 1M records",
           ("summary", "collector_peak_rss_mb"), "<=", 300, "MB",
           beside=(("three replicas", ("summary", "replicas_peak_rss_mb"), "MB"),)),
    Target("store", "store: bytes per record on disk, 1M records",
           ("summary", "bytes_per_record"), "<=", 1500, "B",
           beside=(("JSON layout, 100k", ("baseline_100000", "bytes_per_record"), "B"),)),
    Target("store", "report --since 24h, 1M records", ("1000000", "report", "seconds"),
           "<=", 5.0, "s",
           beside=(("at 100k", ("100000", "report", "seconds"), "s"),
                   ("code before, at 100k", ("baseline_100000", "report", "seconds"), "s"))),
    Target("store", "report --since 24h peak RSS, 1M records",
           ("1000000", "report", "peak_rss_mb"), "<=", 300, "MB",
           beside=(("at 100k", ("100000", "report", "peak_rss_mb"), "MB"),
                   ("code before, at 100k", ("baseline_100000", "report", "peak_rss_mb"),
                    "MB"))),
    Target("store", "chargeback --since 24h, 1M records", ("1000000", "chargeback", "seconds"),
           "<=", 5.0, "s",
           beside=(("at 100k", ("100000", "chargeback", "seconds"), "s"),
                   ("code before, at 100k", ("baseline_100000", "chargeback", "seconds"),
                    "s"))),
    Target("store", "chargeback --since 24h peak RSS, 1M records",
           ("1000000", "chargeback", "peak_rss_mb"), "<=", 300, "MB",
           beside=(("at 100k", ("100000", "chargeback", "peak_rss_mb"), "MB"),
                   ("code before, at 100k", ("baseline_100000", "chargeback", "peak_rss_mb"),
                    "MB"))),
    Target("store_clickhouse", "chdb://: report --since 24h, 10M records",
           ("summary", "report_seconds"), "<=", 2.0, "s",
           beside=(("the view in an open store (the API's), best of 3",
                    ("summary", "open_store_report_best_seconds"), "s"),
                   ("vs 1M", ("summary", "report_ratio_to_smaller"), "x"),
                   ("peak RSS", ("summary", "report_peak_rss_mb"), "MB"),
                   ("bytes per record", ("summary", "bytes_per_record"), "B"))),
    Target("store_clickhouse", "chdb://: chargeback --since 24h, 10M records",
           ("summary", "chargeback_seconds"), "<=", 2.0, "s",
           beside=(("peak RSS", ("summary", "chargeback_peak_rss_mb"), "MB"),)),
    Target("hash_flood", "80,000 spans, trace ids colliding (old hash) vs random: decode CPU",
           ("ratio",), "<=", 2.0, "x",
           beside=(("random ids", ("cpu_ms_random",), "ms"),
                   ("colliding", ("cpu_ms_colliding",), "ms"),
                   ("sequential ids vs random", ("sequential_ratio",), "x"),
                   ("longest probe, colliding", ("longest_probe_colliding",), "slots"))),
    Target("kv_events", "KV-event receiver CPU per block event vs msgspec decode of the "
           "engine's full events", ("cpu", "ratio_to_decode_floor"), "<=", 10.0, "x",
           beside=(("receiver", ("cpu", "cpu_us_per_block_event"), "µs/block"),
                   ("per batch of 16 stored + 16 removed", ("cpu", "cpu_us_per_batch"), "µs"),
                   ("decode floor", ("cpu", "decode_floor_us_per_block_event"), "µs/block"))),
    Target("kv_events", "KV-event index bytes per resident block, 1M blocks",
           ("memory", "bytes_per_resident_block"), "<=", 200.0, "B",
           beside=(("index", ("memory", "index_mib"), "MiB"),
                   ("RSS growth", ("memory", "rss_growth_mib"), "MiB"))),
)


def _run_here(name: str, output: Path) -> int:
    """Run one bench in this process and write its result (or its error) to ``output``."""
    module_name, function, kwargs = BENCHES[name]
    try:
        module = importlib.import_module(module_name)
        fn: Callable[..., dict[str, Any]] = getattr(module, function)
        result = fn(**kwargs)
    except Exception as exc:  # a failing bench is reported, the others still run
        traceback.print_exc()
        output.write_text(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        return 1
    output.write_text(json.dumps(result, default=str))
    return 0


def _run_one(name: str, console: Console) -> dict[str, Any]:
    """One bench in a fresh interpreter: nothing an earlier bench left in memory (its heap,
    which every full garbage collection walks, or its threads) weighs on its figures."""
    started = time.monotonic()
    console.print(f"[bold]running[/] {name} ...", highlight=False)
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp) / "result.json"
        done = subprocess.run([sys.executable, "-m", "bench", "--one", name,
                               "--output", str(output)], check=False)
        if not output.exists():
            return {"error": f"exited with status {done.returncode}"}
        result: dict[str, Any] = json.loads(output.read_text())
        if "error" in result:
            return result
    result["_seconds"] = round(time.monotonic() - started, 1)
    return result


def main() -> int:
    if sys.argv[1:2] == ["reference"]:
        # Not a bench: rewrites the docs' tables from bench/reference_results.json.
        from bench.reference import main as reference_main

        return reference_main(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", help=f"benches to run (default all: {list(BENCHES)}); "
                        "`python -m bench reference [--check]` rewrites the docs' figure "
                        "tables from bench/reference_results.json instead")
    parser.add_argument("--output", default="bench/results/latest.json")
    parser.add_argument("--one", metavar="NAME", help=argparse.SUPPRESS)  # _run_one's child
    args = parser.parse_args()
    if args.one:
        return _run_here(args.one, Path(args.output))
    console = Console()
    names = args.names or list(BENCHES)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        console.print(f"[red]unknown bench:[/] {', '.join(unknown)}")
        return 2
    results = {name: _run_one(name, console) for name in names}
    table = Table(title="tokenpath benchmarks (ratios against baselines in the same run)")
    for col in ("figure", "value", "target", "holds", "measured beside"):
        table.add_column(col)
    for target in TARGETS:
        if target.bench not in results:
            continue
        value = target.value(results)
        if value is None:
            err = results[target.bench].get("error", "not reported")
            table.add_row(target.label, f"[red]{err}[/]", f"{target.op} {target.limit:g}", "-",
                          "")
            continue
        ok = target.holds(value)
        table.add_row(target.label, f"{value:,.4g} {target.unit}",
                      f"{target.op} {target.limit:g} {target.unit}",
                      "[green]yes[/]" if ok else "[red]no[/]", target.beside_text(results))
    console.print(table)
    machine = {"python": sys.version.split()[0], "platform": platform.platform(),
               "cpus": psutil.cpu_count(),
               "memory_gib": round(psutil.virtual_memory().total / 2**30)}
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine, "results": results}, indent=2, default=str))
    console.print(f"results written to {out}")
    console.print_json(json.dumps({k: v for k, v in results.items()}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
