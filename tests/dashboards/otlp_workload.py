"""Synthetic OTLP traces for real `tokenpath collector` processes (the scale-out test,
tests/deploy/test_scale_out.py): one request per trace, all 15 stages as stage events,
GenAI token attributes, TTFT and response chunks. Numbers are synthetic."""

from __future__ import annotations

import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from tests.dashboards.prometheus_stack import free_port
from tokenpath import attributes as attr
from tokenpath.otlp_values import key_value
from tokenpath.stages import STAGES, Phase

READY_TIMEOUT_SECONDS = 60.0


def request_trace(rng: random.Random, model: str, start_unix_nano: int, *,
                  cache_read_share: float | None = None, pool: str = "default"
                  ) -> tuple[bytes, list[Span]]:
    """Spans of one request; ``cache_read_share`` None draws it at random."""
    trace_id = rng.randbytes(16)
    input_tokens = rng.randint(100, 4000)
    share = rng.random() if cache_read_share is None else cache_read_share
    root = Span(trace_id=trace_id, span_id=rng.randbytes(8), name=attr.SPAN_REQUEST,
                kind=Span.SPAN_KIND_SERVER, start_time_unix_nano=start_unix_nano,
                end_time_unix_nano=start_unix_nano + 900_000_000)
    root.attributes.extend([
        key_value(attr.GEN_AI_REQUEST_MODEL, model), key_value(attr.POOL, pool),
        key_value(attr.GEN_AI_USAGE_INPUT_TOKENS, input_tokens),
        key_value(attr.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, int(input_tokens * share)),
        key_value(attr.GEN_AI_USAGE_OUTPUT_TOKENS, rng.randint(1, 500)),
        key_value(attr.TTFT_SECONDS, rng.uniform(0.01, 2.0)),
        key_value(attr.RESPONSE_CHUNKS, 40),
        key_value(attr.RESPONSE_SMALL_CHUNKS, rng.randint(0, 40)),
    ])
    for stage in STAGES:
        event = root.events.add()
        event.name = attr.STAGE_EVENT
        event.time_unix_nano = start_unix_nano + stage.order * 1_000_000
        event.attributes.extend([key_value(attr.STAGE, stage.id.value),
                                 key_value(attr.STAGE_SECONDS, rng.uniform(1e-4, 0.2)),
                                 key_value(attr.PHASE, (Phase.PREFILL if stage.order % 2
                                                  else Phase.DECODE).value)])
    child = Span(trace_id=trace_id, span_id=rng.randbytes(8), parent_span_id=root.span_id,
                 name="engine step", start_time_unix_nano=start_unix_nano + 1_000_000,
                 end_time_unix_nano=start_unix_nano + 51_000_000)
    child.attributes.extend([key_value(attr.STAGE, STAGES[4].id.value)])
    return trace_id, [child, root]


def export_spans(http_url: str, spans: list[Span]) -> None:
    request = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        scope_spans=[ScopeSpans(spans=spans)])])
    post = urllib.request.Request(f"{http_url}/v1/traces", data=request.SerializeToString(),
                                  headers={"Content-Type": "application/x-protobuf"})
    with urllib.request.urlopen(post, timeout=10) as response:
        assert response.status == 200


class CollectorProcess:
    """`tokenpath collector` as a subprocess on a free loopback port (gRPC off)."""

    def __init__(self, workdir: Path, name: str, *, settings: dict[str, object] | None = None,
                 extra_args: tuple[str, ...] = (), store: str | None = None,
                 start: bool = True) -> None:
        """``store``: a ``--store`` value (a ClickHouse URL); else the SQLite file
        ``workdir/NAME.db`` (:attr:`store`)."""
        self.http_url = f"http://127.0.0.1:{free_port()}"
        config = workdir / f"{name}.yaml"
        config.write_text(yaml.safe_dump({"assembler": {"root_grace_seconds": 0.2,
                                                        "tick_seconds": 0.05},
                                          **(settings or {})}), "utf-8")
        self.log = workdir / f"{name}.log"
        self.store = workdir / f"{name}.db"
        self._argv = [sys.executable, "-m", "tokenpath.cli.main", "collector", "--grpc", "off",
                      "--http", self.http_url.removeprefix("http://"),
                      "--store", store or str(self.store), "--config", str(config), *extra_args]
        self.process: subprocess.Popen[bytes] | None = None
        if start:
            self.start()

    def start(self, extra_args: tuple[str, ...] = ()) -> None:
        argv = [*self._argv, *extra_args]
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)

    def wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text(errors="replace")
            try:
                with urllib.request.urlopen(f"{self.http_url}/healthz", timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"collector not ready: {self.log.read_text(errors='replace')}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
