"""Bounded soak: mixed valid and invalid OTLP traffic against a collector process while its
resident memory is sampled; memory must stay flat (docs/reliability.md).

    .venv/bin/python -m bench.soak                 # 10 minutes (the acceptance run)
    .venv/bin/python -m bench.soak --duration 120  # a shorter run
    TOKENPATH_SOAK_SECONDS=120 .venv/bin/pytest -m soak tests/collector/test_soak.py

Traffic per sender thread, in a fixed mix: valid protobuf and OTLP/JSON exports over HTTP,
valid exports over gRPC, malformed protobuf and JSON, gzip bombs, oversized bodies, wrong
content types and spans with bad ids. Every trace id is new, so the assembler, the store
and the finished-trace memory all churn. RSS is sampled every ``--sample-seconds``; the
first ``--warmup`` fraction of the run is excluded, and the median of the last third of
the remaining samples is compared with the median of the first third. The run passes
when that growth stays under ``--max-growth`` (relative) plus ``--slack-mib``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import psutil

from testkit.support.otlp import (
    JSON_HEADERS,
    PROTOBUF_HEADERS,
    export_request,
    make_span,
    new_trace_id,
    request_span,
    to_otlp_json,
)
from testkit.support.processes import free_port, tokenpath_cmd, wait_http
from tokenpath import attributes as A
from tokenpath.stages import StageId

TRACE_EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
# Small enough that the bounded structures reach steady state early in the run.
SOAK_CONFIG = """\
assembler:
  root_grace_seconds: 0.2
  idle_timeout_seconds: 5
  finished_memory: 20000
limits:
  max_body_bytes: 1048576
  max_decompressed_bytes: 4194304
"""
DEFAULT_DURATION = 600.0
ENV_DURATION = "TOKENPATH_SOAK_SECONDS"


@dataclass
class SoakResult:
    duration_seconds: float
    rss_samples_mib: list[tuple[float, float]] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    baseline_mib: float = 0.0
    final_mib: float = 0.0
    growth_mib: float = 0.0
    growth_ratio: float = 0.0
    passed: bool = False
    records_stored: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "duration_seconds": self.duration_seconds,
            "baseline_rss_mib": round(self.baseline_mib, 1),
            "final_rss_mib": round(self.final_mib, 1),
            "growth_mib": round(self.growth_mib, 1),
            "growth_ratio": round(self.growth_ratio, 4),
            "max_rss_mib": round(max((m for _, m in self.rss_samples_mib), default=0.0), 1),
            "rss_samples_mib": [(round(t, 1), round(m, 1)) for t, m in self.rss_samples_mib],
            "responses": dict(sorted(self.statuses.items())),
            "records_stored": self.records_stored,
            "passed": self.passed,
        }


def _valid_spans(rng: random.Random) -> list[Any]:
    spans = []
    for _ in range(rng.randint(1, 4)):
        trace_id = new_trace_id()
        root = request_span(trace_id, model=f"model-{rng.randint(0, 80)}",
                            attrs={A.GEN_AI_USAGE_INPUT_TOKENS: rng.randint(1, 4000),
                                   A.GEN_AI_USAGE_OUTPUT_TOKENS: rng.randint(1, 500),
                                   "gen_ai.prompt": "x" * rng.randint(0, 2000)},
                            events=[(A.STAGE_EVENT, {A.STAGE: StageId.KV_CACHE_LOOKUP.value,
                                                     A.STAGE_SECONDS: rng.random() / 100})])
        spans.append(root)
        spans.extend(make_span(trace_id, parent=root.span_id,
                               attrs={A.STAGE: StageId.SCHEDULER_QUEUE.value})
                     for _ in range(rng.randint(0, 3)))
    return spans


def _one_request(rng: random.Random, url: str, client: httpx.Client,
                 channel: grpc.Channel) -> str:
    kind = rng.choices(
        ["protobuf", "json", "grpc", "bad_protobuf", "bad_json", "gzip_bomb", "oversized",
         "content_type", "bad_ids"],
        weights=[40, 15, 15, 6, 6, 4, 4, 5, 5])[0]
    post = url + "/v1/traces"
    if kind == "grpc":
        body = export_request(_valid_spans(rng)).SerializeToString()
        try:
            channel.unary_unary(TRACE_EXPORT)(body, timeout=5)
            return "grpc:OK"
        except grpc.RpcError as err:
            return f"grpc:{err.code().name}"  # type: ignore[attr-defined]
    if kind == "protobuf":
        response = client.post(post, content=export_request(_valid_spans(rng))
                               .SerializeToString(), headers=PROTOBUF_HEADERS)
    elif kind == "json":
        response = client.post(post, content=to_otlp_json(export_request(_valid_spans(rng))),
                               headers=JSON_HEADERS)
    elif kind == "bad_protobuf":
        response = client.post(post, content=rng.randbytes(rng.randint(1, 2000)),
                               headers=PROTOBUF_HEADERS)
    elif kind == "bad_json":
        text = to_otlp_json(export_request(_valid_spans(rng)))
        response = client.post(post, content=text[: rng.randint(0, len(text) - 1)],
                               headers=JSON_HEADERS)
    elif kind == "gzip_bomb":
        response = client.post(post, content=_BOMB,
                               headers={**PROTOBUF_HEADERS, "Content-Encoding": "gzip"})
    elif kind == "oversized":
        response = client.post(post, content=b"\x0a" * (2 << 20), headers=PROTOBUF_HEADERS)
    elif kind == "content_type":
        response = client.post(post, content=b"hello", headers={"Content-Type": "text/plain"})
    else:
        spans = _valid_spans(rng)
        spans[0].span_id = b"\x01\x02\x03"
        response = client.post(post, content=export_request(spans).SerializeToString(),
                               headers=PROTOBUF_HEADERS)
    return f"http:{response.status_code}"


_BOMB = gzip.compress(b"\x00" * (64 << 20))


def _sender(url: str, grpc_endpoint: str, stop: threading.Event, seed: int,
            statuses: Counter[str], lock: threading.Lock, rate_per_second: float) -> None:
    rng = random.Random(seed)
    interval = 1.0 / rate_per_second
    with httpx.Client(timeout=10) as client, grpc.insecure_channel(grpc_endpoint) as channel:
        next_at = time.monotonic()
        while not stop.is_set():
            try:
                outcome = _one_request(rng, url, client, channel)
            except httpx.HTTPError as exc:
                outcome = f"http:error:{type(exc).__name__}"
            with lock:
                statuses[outcome] += 1
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))


def run(duration: float = DEFAULT_DURATION, senders: int = 2, rate_per_sender: float = 50.0,
        sample_seconds: float = 5.0, warmup: float = 0.2, max_growth: float = 0.10,
        slack_mib: float = 16.0) -> SoakResult:
    result = SoakResult(duration)
    with tempfile.TemporaryDirectory(prefix="tokenpath-soak-") as tmp:
        config = Path(tmp) / "collector.yaml"
        config.write_text(SOAK_CONFIG)
        http_port, grpc_port = free_port(), free_port()
        proc = subprocess.Popen(
            tokenpath_cmd("collector", "--http", f"127.0.0.1:{http_port}", "--grpc",
                          f"127.0.0.1:{grpc_port}", "--store", str(Path(tmp) / "store.db"),
                          "--config", str(config), "--log-level", "error"),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{http_port}"
        try:
            wait_http(url + "/healthz")
            process = psutil.Process(proc.pid)
            stop, lock = threading.Event(), threading.Lock()
            threads = [threading.Thread(
                target=_sender, args=(url, f"127.0.0.1:{grpc_port}", stop, seed,
                                      result.statuses, lock, rate_per_sender), daemon=True)
                for seed in range(senders)]
            for thread in threads:
                thread.start()
            start = time.monotonic()
            while (elapsed := time.monotonic() - start) < duration:
                result.rss_samples_mib.append((elapsed, process.memory_info().rss / 2**20))
                time.sleep(min(sample_seconds, max(0.0, duration - elapsed)))
            result.rss_samples_mib.append((time.monotonic() - start,
                                           process.memory_info().rss / 2**20))
            stop.set()
            for thread in threads:
                thread.join(timeout=30)
            metrics = httpx.get(url + "/metrics", timeout=10).text
            for line in metrics.splitlines():
                if line.startswith("tokenpath_collector_records_stored_total"):
                    result.records_stored = int(float(line.split()[-1]))
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    _judge(result, duration * warmup, max_growth, slack_mib)
    return result


def _judge(result: SoakResult, warmup_seconds: float, max_growth: float,
           slack_mib: float) -> None:
    steady = [m for t, m in result.rss_samples_mib if t >= warmup_seconds]
    if len(steady) < 3:
        steady = [m for _, m in result.rss_samples_mib]
    third = max(1, len(steady) // 3)
    result.baseline_mib = statistics.median(steady[:third])
    result.final_mib = statistics.median(steady[-third:])
    result.growth_mib = result.final_mib - result.baseline_mib
    result.growth_ratio = result.growth_mib / result.baseline_mib
    result.passed = result.growth_mib <= max_growth * result.baseline_mib + slack_mib


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float,
                        default=float(os.environ.get(ENV_DURATION, DEFAULT_DURATION)))
    parser.add_argument("--senders", type=int, default=2)
    parser.add_argument("--rate", type=float, default=50.0, help="exports/s per sender")
    parser.add_argument("--sample-seconds", type=float, default=5.0)
    parser.add_argument("--max-growth", type=float, default=0.10)
    parser.add_argument("--slack-mib", type=float, default=16.0)
    args = parser.parse_args(argv)
    result = run(args.duration, args.senders, args.rate, args.sample_seconds,
                 max_growth=args.max_growth, slack_mib=args.slack_mib)
    json.dump(result.to_json(), sys.stdout, indent=1)
    print()
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
