"""Pricing at scale (docs/performance.md): the collector's CPU per request with 3,000 models
active on one node against the same traffic on one model, and the slowest ``/metrics``
answer while it prices that burst and while it prices a 100,000-request backlog.

Every run is a fresh collector process (``tokenpath collector``, its default settings but
an allowed lateness of at least ``MIN_DELAY_SECONDS`` and a one-second assembler grace),
fed vLLM's own ``llm_request`` spans over OTLP/HTTP (no gateway, no tokenpath code), 429s
honoured:

- burst: 3,000 requests scheduled within five seconds on one engine, all in flight
  together (testkit/pricing_traffic.py), each on its own model (LoRA adapters are served
  this way: the adapter is the request's model), or all on one; sent a minute after they
  ended. Once every record reached pricing, one short request a minute later moves the
  node's watermark past the burst: one close of 9,000 engine events and 3,000 records.
  CPU: the collector process's, from the first export sent to the 3,000th record stored
  (medians of ``rounds`` runs of each, alternated, no scraping meanwhile).
- backlog: 100,000 requests on four nodes, 10 minutes old, in the order they ended, sent
  as fast as the collector accepts them; until all are stored.

While a burst of 3,000 models and the backlog are priced (runs of their own), a thread
of this process asks for ``/metrics`` back to back; the slowest answer is reported.

    python -m bench.pricing_scale [--rounds N] [--backlog N]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from bench.ingest import CpuClock, _counter, _free_port, _stored_rows
from testkit.pricing_traffic import backlog, burst, closing_record
from tokenpath import attributes as A
from tokenpath import metric_names as M
from tokenpath.otlp_values import key_value
from tokenpath.records import RequestRecord

BURST = 3_000
BACKLOG = 100_000
ROUNDS = 3
# the burst's allowed lateness, above its longest request: none of it misses its window
MIN_DELAY_SECONDS = 20.0
SPANS_PER_EXPORT = 1_000
PROTOBUF = {"Content-Type": "application/x-protobuf"}
WAIT_SECONDS = 900.0
ASSEMBLER = """assembler:
  root_grace_seconds: 1.0
"""
BURST_CONFIG = ASSEMBLER + f"""cost:
  min_delay_seconds: {MIN_DELAY_SECONDS}
"""


def _ns(t: float) -> int:
    return int(t * 1e9)


def _exports(records: list[RequestRecord], seed: int) -> Iterator[bytes]:
    """``records`` as vLLM exports them: one ``llm_request`` span each, under its
    engine's resource (service.instance.id, host.name), ``SPANS_PER_EXPORT`` a request."""
    rng = random.Random(seed)
    for i in range(0, len(records), SPANS_PER_EXPORT):
        by_engine: dict[tuple[str, str], list[Span]] = {}
        for record in records[i:i + SPANS_PER_EXPORT]:
            ps, ds = record.prefill_start_unix, record.decode_start_unix
            end = record.engine_end_unix
            assert ps is not None and ds is not None and end is not None
            arrival = ps - 0.005
            by_engine.setdefault((record.engine_id or "", record.node or ""), []).append(Span(
                trace_id=rng.randbytes(16), span_id=rng.randbytes(8),
                name=A.VLLM_REQUEST_SPAN_NAME, kind=Span.SPAN_KIND_SERVER,
                start_time_unix_nano=_ns(arrival), end_time_unix_nano=_ns(end),
                attributes=[
                    key_value(A.GEN_AI_REQUEST_MODEL, record.model),
                    key_value(A.GEN_AI_REQUEST_ID, f"cmpl-{record.trace_id[:16]}"),
                    key_value(A.VLLM_USAGE_PROMPT_TOKENS, record.input_tokens),
                    key_value(A.VLLM_USAGE_COMPLETION_TOKENS, record.output_tokens),
                    key_value(A.VLLM_LATENCY_TIME_IN_QUEUE, ps - arrival),
                    key_value(A.VLLM_LATENCY_TIME_TO_FIRST_TOKEN, ds - arrival),
                    key_value(A.VLLM_LATENCY_E2E, end - arrival),
                    key_value(A.VLLM_LATENCY_TIME_IN_MODEL_PREFILL, ds - ps),
                    key_value(A.VLLM_LATENCY_TIME_IN_MODEL_DECODE, end - ds),
                ]))
        export = ExportTraceServiceRequest()
        for (engine, node), spans in by_engine.items():
            out = ResourceSpans(resource=Resource(attributes=[
                key_value(A.SERVICE_NAME, "vllm"), key_value(A.SERVICE_INSTANCE_ID, engine),
                key_value(A.HOST_NAME, node)]))
            scoped = ScopeSpans(spans=spans)
            scoped.scope.name = "vllm.tracing"
            out.scope_spans.append(scoped)
            export.resource_spans.append(out)
        yield export.SerializeToString()


def _send(client: httpx.Client, url: str, body: bytes) -> None:
    while True:
        response = client.post(f"{url}/v1/traces", content=body, headers=PROTOBUF)
        if response.status_code != 429:
            response.raise_for_status()
            return
        time.sleep(float(response.headers.get("Retry-After", "0.05")))


class _Collector:
    """A collector process on free ports, its store in a temporary folder."""

    def __init__(self, folder: Path, config_text: str) -> None:
        self.store = folder / "store.db"
        config = folder / "collector.yaml"
        config.write_text(config_text)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tokenpath.cli.main", "collector", "--http",
             f"127.0.0.1:{self.port}", "--grpc", "off", "--store", str(self.store),
             "--config", str(config), "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("collector did not start")

    def counter(self, spec: M.MetricSpec) -> float:
        return _counter(self.port, spec.series)

    def wait(self, done: Any, what: str) -> None:
        deadline = time.monotonic() + WAIT_SECONDS
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(what)
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class _Scraper(threading.Thread):
    """Asks for ``/metrics`` back to back; keeps each answer's seconds."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.seconds: list[float] = []
        self._halt = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=120) as client:
            while not self._halt.is_set():
                began = time.perf_counter()
                client.get(f"{self.url}/metrics").raise_for_status()
                self.seconds.append(time.perf_counter() - began)

    def finish(self) -> dict[str, float]:
        self._halt.set()
        self.join(timeout=150)
        return {"slowest_seconds": max(self.seconds), "scrapes": len(self.seconds),
                "median_seconds": statistics.median(self.seconds)}


@contextmanager
def _scraping(url: str, on: bool) -> Iterator[_Scraper | None]:
    scraper = _Scraper(url) if on else None
    if scraper is not None:
        scraper.start()
    yield scraper


def _burst_run(models: int, scrape: bool) -> dict[str, Any]:
    start = time.time() - 80.0  # ended a minute ago
    records = burst(start, BURST, models)
    closing = closing_record(records[-1], 60.0)
    bodies = list(_exports(records, seed=models))
    with tempfile.TemporaryDirectory() as folder:
        collector = _Collector(Path(folder), BURST_CONFIG)
        try:
            proc = psutil.Process(collector.proc.pid)
            cpu = CpuClock(proc)
            began = time.monotonic()
            with _scraping(collector.url, scrape) as scraper, httpx.Client(timeout=120) as client:
                for body in bodies:
                    _send(client, collector.url, body)
                collector.wait(lambda: collector.counter(M.PRICING_RECORDS_IN) >= BURST,
                               "every record reached pricing")
                for body in _exports([closing], seed=0):
                    _send(client, collector.url, body)
                collector.wait(lambda: _stored_rows(collector.store) >= BURST,
                               "the burst stored")
                seconds, exact = cpu.seconds()
                result: dict[str, Any] = {
                    "cpu_us_per_request": seconds / BURST * 1e6, "cpu_scheduler_count": exact,
                    "wall_seconds": time.monotonic() - began,
                    "late_records": collector.counter(M.RECORDS_LATE),
                    "steps": collector.counter(M.PRICING_STEPS)}
                if scraper is not None:
                    result["metrics"] = scraper.finish()
        finally:
            collector.stop()
    return result


def _backlog_run(count: int) -> dict[str, Any]:
    records = backlog(time.time() - 600.0, count)
    # each node's last request a minute later: its arrival closes the rest (no wait for
    # the node to go quiet)
    last: dict[str | None, RequestRecord] = {r.node: r for r in records}
    closing = [closing_record(r, 60.0) for r in last.values()]
    for i, record in enumerate(closing):
        record.trace_id = record.record_id = f"{10**9 + i:032x}"
    bodies = list(_exports(records + closing, seed=1))
    with tempfile.TemporaryDirectory() as folder:
        collector = _Collector(Path(folder), ASSEMBLER)
        try:
            began = time.monotonic()
            with _scraping(collector.url, True) as scraper, httpx.Client(timeout=120) as client:
                for body in bodies:
                    _send(client, collector.url, body)
                collector.wait(lambda: _stored_rows(collector.store) >= count,
                               "the backlog stored")
                seconds = time.monotonic() - began
                assert scraper is not None
                return {"requests": count, "wall_seconds": seconds,
                        "requests_per_second": count / seconds,
                        "late_records": collector.counter(M.RECORDS_LATE),
                        "steps": collector.counter(M.PRICING_STEPS),
                        "metrics": scraper.finish()}
        finally:
            collector.stop()


def run(rounds: int = ROUNDS, backlog_requests: int = BACKLOG) -> dict[str, Any]:
    one: list[float] = []
    many: list[float] = []
    for _ in range(rounds):
        one.append(_burst_run(1, scrape=False)["cpu_us_per_request"])
        many.append(_burst_run(BURST, scrape=False)["cpu_us_per_request"])
    one_us, many_us = statistics.median(one), statistics.median(many)
    burst_scraped = _burst_run(BURST, scrape=True)
    one_scraped = _burst_run(1, scrape=True)
    backlog_scraped = _backlog_run(backlog_requests)
    return {
        "cpu_us_per_request_1_model": one_us,
        "cpu_us_per_request_3000_models": many_us,
        "cpu_ratio_3000_to_1": many_us / one_us,
        "rounds": rounds,
        "burst_slowest_metrics_seconds": burst_scraped["metrics"]["slowest_seconds"],
        "burst_1_model_slowest_metrics_seconds": one_scraped["metrics"]["slowest_seconds"],
        "backlog_slowest_metrics_seconds": backlog_scraped["metrics"]["slowest_seconds"],
        "burst_3000_models": burst_scraped,
        "burst_1_model": one_scraped,
        "backlog": backlog_scraped,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pricing_scale", description=__doc__)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--backlog", type=int, default=BACKLOG)
    args = parser.parse_args()
    print(json.dumps(run(args.rounds, args.backlog), indent=2))


if __name__ == "__main__":
    main()
