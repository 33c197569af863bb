"""Collector ingest: CPU per span vs the floor of parsing the payload in Python.

Two figures, both against the floor (parse the same payloads and read every field in
Python) measured in the same run:

- ``ingest_path``: what a receiver does per export request, in this process on one
  thread: parse, decode under the limits, hand the spans to the assembler's buffer;
- ``http`` / ``grpc``: the whole collector as a subprocess while another process (this
  one) sends 100-span requests of 15-stage traces: transport, decoding, assembly,
  mapping, cost attribution, Prometheus and the SQLite store, until every trace is
  stored (this process counts the rows of the collector's SQLite file, which costs the
  collector nothing). CPU time is the collector process's, from the scheduler's
  nanosecond count of each of its threads (``CpuClock``; psutil's 10 ms ticks where that
  cannot be read). The count runs until
  the last trace is stored, which is at least the root grace period (6 s) after the last
  span arrived, so it includes what the collector spends idle meanwhile: its idle CPU
  share is measured first (``idle_cpu_percent_of_core``, over ``IDLE_WINDOW_SECONDS``)
  and the figure without it is reported beside (``cpu_us_per_span_net_of_idle``). Each
  transport runs ``collector_runs`` times, interleaved; the figure is the run with the
  least CPU (the floor is the best of its repeats too, which run before the collector
  runs and once beside each of them), every run's beside. Before each run the payloads'
  times are moved so that they end as sending starts (``rebased``).
- ``http_reference_decoder`` and ``http_pure_python_core``: the same OTLP/HTTP runs,
  interleaved with the others, of a collector with the pure-Python reference decoder and
  of one with the compiled core's modules run as plain Python (tokenpath/compiled.py):
  what each compiled part buys, on the same traffic in the same run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import grpc
import httpx
import psutil
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from bench.payloads import (
    SHAPE_REFERENCE_PATH,
    SHAPE_STAGE_SPANS,
    make_requests,
    parse_floor,
    reference_path_requests,
)
from tokenpath import metric_names as M
from tokenpath.collector.assembler import Assembler, AssemblerConfig
from tokenpath.collector.gc_tuning import DEFAULT_GC_YOUNG_THRESHOLD, tune_gc
from tokenpath.collector.limits import IngestLimits
from tokenpath.collector.node_metrics import NodeMetricsState
from tokenpath.collector.receivers.ingest import OtlpIngest
from tokenpath.collector.receivers.otlp_decode import (
    DECODER_ENV,
    native_decoder_available,
    parse_trace_request,
)
from tokenpath.collector.stats import CollectorStats
from tokenpath.compiled import PURE_PYTHON_ENV, compiled_modules
from tokenpath.compiled import describe as describe_compiled_core

IDLE_WINDOW_SECONDS = 3.0
SPANS_RECEIVED = M.SPANS_RECEIVED.series + "{"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Whole-collector variants: the collector as built, and beside it (same run, same
# traffic) with the pure-Python reference decoder, and with the compiled core's modules
# run as plain Python (tokenpath/compiled.py), so the bench says what each compiled part
# buys. Each is the environment its collector process gets.
AS_BUILT: dict[str, str] = {}
REFERENCE_DECODER_ENV = {DECODER_ENV: "python"}
PURE_PYTHON_CORE_ENV = {PURE_PYTHON_ENV: "1"}


def _start_collector(store: Path, variant: dict[str, str]
                     ) -> tuple[subprocess.Popen[bytes], int, int]:
    http_port, grpc_port = _free_port(), _free_port()
    env = {**os.environ, **variant}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenpath.cli.main", "collector", "--http",
         f"127.0.0.1:{http_port}", "--grpc", f"127.0.0.1:{grpc_port}", "--store", str(store),
         "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{http_port}/healthz", timeout=1).status_code == 200:
                return proc, http_port, grpc_port
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("collector did not start")


def process_cpu_seconds(proc: psutil.Process) -> float:
    """User and system CPU seconds of ``proc`` and its children."""
    t = proc.cpu_times()
    total = t.user + t.system
    for child in proc.children(recursive=True):
        ct = child.cpu_times()
        total += ct.user + ct.system
    return total


def thread_cpu_ns(pid: int) -> dict[int, int] | None:
    """Each live thread's CPU time in nanoseconds (the scheduler's own count, the first
    field of ``/proc/PID/task/TID/schedstat``); None where the kernel does not keep it."""
    found: dict[int, int] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                found[int(tid)] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended between the listing and the read
    return found or None


class CpuClock:
    """The collector process's CPU seconds since it was made.

    psutil's process times come in clock ticks (10 ms here), which is 4% of a
    reference-path run's 0.26 s; the threads' scheduler counts are in nanoseconds. They
    are used when every thread alive at the start is still alive at the end (an ended
    thread takes its count with it) and the process has no children; otherwise the
    tick count is (:meth:`seconds` says which)."""

    def __init__(self, proc: psutil.Process) -> None:
        self._proc = proc
        self._ticks = process_cpu_seconds(proc)
        self._threads = thread_cpu_ns(proc.pid)

    def seconds(self) -> tuple[float, bool]:
        """CPU seconds since the start, and whether they are the scheduler's count."""
        ticks = process_cpu_seconds(self._proc) - self._ticks
        now = thread_cpu_ns(self._proc.pid)
        start = self._threads
        if (start is None or now is None or not start.keys() <= now.keys()
                or self._proc.children(recursive=True)):
            return ticks, False
        return sum(ns - start.get(tid, 0) for tid, ns in now.items()) / 1e9, True


def _counter(http_port: int, prefix: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{http_port}/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(prefix):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _stored_rows(store: Path) -> int:
    """Records the collector has written, read from its SQLite file by this process (a
    read-only connection: WAL readers never block the writer), so waiting costs the
    collector nothing; scraping its /metrics five times a second cost it 1.5 ms a scrape."""
    if not store.exists():
        return 0
    try:
        with closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=5)) as db:
            return int(db.execute("SELECT COUNT(*) FROM records").fetchone()[0])
    except sqlite3.OperationalError:  # not created yet
        return 0


def _wait_stored(store: Path, traces: int, timeout: float = 120.0) -> int:
    """Wait until every trace was finalized, mapped and written: the whole pipeline ran."""
    deadline = time.monotonic() + timeout
    stored = 0
    while time.monotonic() < deadline:
        stored = _stored_rows(store)
        if stored >= traces:
            break
        time.sleep(0.2)
    return stored


def _parsed(payloads: list[bytes]) -> list[ExportTraceServiceRequest]:
    messages = []
    for body in payloads:
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        messages.append(message)
    return messages


def _spans(message: ExportTraceServiceRequest) -> Iterator[Span]:
    for rs in message.resource_spans:
        for ss in rs.scope_spans:
            yield from ss.spans


def _trace_count(payloads: list[bytes]) -> int:
    return len({span.trace_id for message in _parsed(payloads) for span in _spans(message)})


def _send_http(port: int, payloads: list[bytes], workers: int) -> None:
    url = f"http://127.0.0.1:{port}/v1/traces"
    headers = {"Content-Type": "application/x-protobuf"}

    def send(chunk: list[bytes]) -> None:
        with httpx.Client(timeout=30) as client:
            for body in chunk:
                r = client.post(url, content=body, headers=headers)
                r.raise_for_status()

    chunks = [payloads[i::workers] for i in range(workers)]
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(send, chunks))


def _send_grpc(port: int, payloads: list[bytes], workers: int) -> None:
    messages = _parsed(payloads)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = trace_service_pb2_grpc.TraceServiceStub(channel)  # type: ignore[no-untyped-call]

    def send(chunk: list[ExportTraceServiceRequest]) -> None:
        for m in chunk:
            stub.Export(m, timeout=30)

    chunks = [messages[i::workers] for i in range(workers)]
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(send, chunks))
    channel.close()


@contextmanager
def _collector_gc() -> Iterator[None]:
    """This process with the collector process's garbage-collector settings
    (collector/gc_tuning.py) while an in-process figure is measured: with Python's default
    the ingest path of the reference-path payloads measured 11.6 to 53.7 µs a span from
    one repeat to the next, as older collections walking the growing buffer fell in a
    repeat or not; the collector runs never see that."""
    threshold = gc.get_threshold()
    tune_gc(DEFAULT_GC_YOUNG_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def _floor_cpu(payloads: list[bytes]) -> float:
    """CPU seconds of one floor repeat, under the collector's GC settings."""
    with _collector_gc():
        t = time.process_time()
        parse_floor(payloads)
        return time.process_time() - t


def _ingest_path_cpu(payloads: list[bytes], reference_decoder: bool = False) -> float:
    """CPU seconds to decode and buffer every payload, as a receiver does (with the
    native decoder where built), or with protobuf's parser and the reference decoder;
    under the collector's GC settings."""

    class _Discard:
        def consume_trace(self, trace: object) -> None:
            del trace

        def shutdown(self) -> None:
            pass

    stats = CollectorStats()
    config = AssemblerConfig(root_grace_seconds=3600, idle_timeout_seconds=3600,
                             max_traces=10**6)
    ingest = OtlpIngest(Assembler(_Discard(), config, stats), NodeMetricsState(),
                        IngestLimits(), stats)
    with _collector_gc():
        t = time.process_time()
        if reference_decoder:
            for body in payloads:
                ingest.export_traces(parse_trace_request(body, "protobuf"), "bench")
        else:
            for body in payloads:
                ingest.export_trace_payload(body, "protobuf", "bench")
        return time.process_time() - t


def run(requests: int = 300, workers: int = 2, repeats: int = 3,
        reference_requests: int = 1500, collector_runs: int = 3) -> dict[str, Any]:
    """Both payload shapes (bench.payloads.SHAPES); the top-level figures are the
    15-stage shape's, as before. The floor and the ingest path are the best of
    ``repeats``, each whole-collector figure the best of ``collector_runs``."""
    shapes = {SHAPE_STAGE_SPANS: make_requests(requests),
              SHAPE_REFERENCE_PATH: reference_path_requests(reference_requests)}
    results: dict[str, Any] = {"shapes": {
        name: _measure(payloads, workers, repeats, collector_runs)
        for name, payloads in shapes.items()}}
    results.update(results["shapes"][SHAPE_STAGE_SPANS])
    return results


def _measure(payloads: list[bytes], workers: int, repeats: int,
             collector_runs: int) -> dict[str, Any]:
    spans = parse_floor(payloads)
    traces = _trace_count(payloads)
    floors, ingests, references = [], [], []
    for _ in range(repeats):  # interleaved, best of each: the machine is shared
        floors.append(_floor_cpu(payloads))
        ingests.append(_ingest_path_cpu(payloads))
        references.append(_ingest_path_cpu(payloads, reference_decoder=True))
    runs = [("http", _send_http, AS_BUILT), ("grpc", _send_grpc, AS_BUILT)]
    if native_decoder_available():  # the same whole-collector run without it, beside
        runs.append(("http_reference_decoder", _send_http, REFERENCE_DECODER_ENV))
    if compiled_modules():  # and without the compiled core
        runs.append(("http_pure_python_core", _send_http, PURE_PYTHON_CORE_ENV))
    found: dict[str, list[dict[str, Any]]] = {transport: [] for transport, _, _ in runs}
    with tempfile.TemporaryDirectory() as tmp:
        for attempt in range(collector_runs):  # interleaved, like the floor's repeats
            for transport, sender, variant in runs:
                # a floor repeat beside each run: the floor gets the same chances of this
                # shared machine's quiet moments as the collector runs do
                floors.append(_floor_cpu(payloads))
                store = Path(tmp) / f"{transport}-{attempt}.db"
                found[transport].append(_collector_run(store, sender, variant,
                                                       payloads, traces, workers))
    floor_cpu, ingest_cpu, reference_cpu = min(floors), min(ingests), min(references)
    results: dict[str, Any] = {
        "spans": spans,
        "traces": traces,
        "compiled_decoder": native_decoder_available(),
        "compiled_core": describe_compiled_core(),
        "floor_cpu_us_per_span": floor_cpu / spans * 1e6,
        "floor_cpu_us_per_span_repeats": [f / spans * 1e6 for f in floors],
        "ingest_path": {
            "cpu_us_per_span": ingest_cpu / spans * 1e6,
            "ratio_to_floor": ingest_cpu / floor_cpu,
            "spans_per_core_second": spans / ingest_cpu,
        },
        "ingest_path_reference_decoder": {
            "cpu_us_per_span": reference_cpu / spans * 1e6,
            "ratio_to_floor": reference_cpu / floor_cpu,
        },
    }
    for transport, measured in found.items():
        # The least CPU of the runs, as the floor is the least of its repeats: sharing the
        # machine only ever adds CPU. Every run's figure and its losses are kept beside.
        best = min(measured, key=lambda m: m["cpu"])
        cpu = best["cpu"]
        per_span = cpu / spans
        net_per_span = max(0.0, cpu - best["idle_share"] * best["counted_wall"]) / spans
        results[transport] = {
            "cpu_us_per_span": per_span * 1e6,
            "cpu_us_per_span_runs": [m["cpu"] / spans * 1e6 for m in measured],
            "idle_cpu_percent_of_core": best["idle_share"] * 100,
            "cpu_us_per_span_net_of_idle": net_per_span * 1e6,
            "counted_wall_seconds": best["counted_wall"],
            # "scheduler": nanosecond thread counts; "ticks": 10 ms process ticks
            "cpu_clock_runs": [m["cpu_clock"] for m in measured],
            "cpu_us_per_request": cpu / traces * 1e6,
            "spans_per_request": spans / traces,
            "ratio_to_floor": per_span / (floor_cpu / spans),
            "spans_per_core_second": spans / cpu if cpu else None,
            "wall_spans_per_second": spans / best["send_wall"],
            "spans_received": min(m["received"] for m in measured),
            "lost": max(spans - m["received"] for m in measured),
            "records_stored": min(m["stored"] for m in measured),
            "traces_sent": traces,
        }
    return results


def rebased(payloads: list[bytes], now_ns: int) -> list[bytes]:
    """The payloads with every span and event time moved by one offset, so that the last
    span ends at ``now_ns``: the spans arrive as if just sent by their engines, and every
    run sees the same traffic (without it every run but the first would replay older
    traces; the cost attributor prices those by their engines' own time, but their
    timestamps, stored and exposed, would differ from run to run)."""
    messages = _parsed(payloads)
    offset = now_ns - max(span.end_time_unix_nano for message in messages
                          for span in _spans(message))
    for message in messages:
        for span in _spans(message):
            span.start_time_unix_nano += offset
            span.end_time_unix_nano += offset
            for event in span.events:
                event.time_unix_nano += offset
    return [message.SerializeToString() for message in messages]


def _collector_run(store: Path, sender: Callable[[int, list[bytes], int], None],
                   variant: dict[str, str], payloads: list[bytes], traces: int,
                   workers: int) -> dict[str, float]:
    """One collector subprocess fed every payload until all ``traces`` are stored: its
    CPU seconds, idle share, and what it received and stored."""
    proc, http_port, grpc_port = _start_collector(store, variant)
    ps = psutil.Process(proc.pid)
    try:
        time.sleep(1.0)  # let start-up CPU settle
        idle = CpuClock(ps)
        time.sleep(IDLE_WINDOW_SECONDS)
        idle_share = idle.seconds()[0] / IDLE_WINDOW_SECONDS
        payloads = rebased(payloads, time.time_ns())
        clock = CpuClock(ps)
        started = wall = time.monotonic()
        sender(grpc_port if sender is _send_grpc else http_port, payloads, workers)
        wall = time.monotonic() - wall
        stored = _wait_stored(store, traces)
        # The CPU counted is the collector's own, before the one scrape below.
        cpu, precise = clock.seconds()
        counted_wall = time.monotonic() - started
        received = _counter(http_port, SPANS_RECEIVED)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return {"cpu": cpu, "idle_share": idle_share, "counted_wall": counted_wall,
            "send_wall": wall, "received": received, "stored": stored,
            "cpu_clock": "scheduler" if precise else "ticks"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--collector-runs", type=int, default=3)
    args = parser.parse_args()
    print(json.dumps(run(args.requests, args.workers, collector_runs=args.collector_runs),
                     indent=2))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
