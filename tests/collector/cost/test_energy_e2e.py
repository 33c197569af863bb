"""Measured GPU energy end to end: the real node agent samples a fake NVML whose energy
counters rise with the GPUs' power and pushes them over OTLP to a real collector, while a
batch of a few hundred overlapping vLLM-shaped requests arrives over OTLP from the
OpenTelemetry SDK. The collector apportions the measured joules: the stored records' joules
plus the idle joules equal the GPUs' joules the agent reported over the priced window."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from testkit.fakes.fake_nvml import FakeGpu, FakeNvml
from tokenpath import attributes as A
from tokenpath.agent.config import AgentConfig
from tokenpath.agent.service import AgentService
from tokenpath.collector.config import CollectorConfig
from tokenpath.collector.cost.attributor import AttributorConfig
from tokenpath.collector.cost.energy import ENERGY_MEASURED
from tokenpath.collector.service import CollectorService
from tokenpath.collector.store.factory import open_store_readonly

pytestmark = pytest.mark.integration

NODE = "gpu-node-energy"
REQUESTS = 256


def _wait_for(condition: Callable[[], bool], what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _emit_batch(endpoint: str, start: float) -> float:
    """``REQUESTS`` requests admitted 10 ms apart on one TP=2 engine, each decoding for
    about two seconds: at the peak some two hundred are in the batch. Returns the last end."""
    provider = TracerProvider(resource=Resource.create({A.NODE: NODE}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    tracer = provider.get_tracer("energy-e2e")
    last = start
    for i in range(REQUESTS):
        queue, prefill, decode = 0.002, 0.04 + 0.002 * (i % 5), 1.8 + 0.02 * (i % 17)
        begin = start + 0.01 * i
        end = begin + queue + prefill + decode
        last = max(last, end)
        span = tracer.start_span(A.VLLM_REQUEST_SPAN_NAME, start_time=int(begin * 1e9))
        span.set_attributes({
            A.GEN_AI_REQUEST_MODEL: "llama-3.1-8b",
            A.VLLM_USAGE_PROMPT_TOKENS: 400 + 50 * (i % 9),
            A.VLLM_USAGE_COMPLETION_TOKENS: 90 + i % 30,
            A.VLLM_LATENCY_TIME_IN_QUEUE: queue,
            A.VLLM_LATENCY_TIME_IN_MODEL_PREFILL: prefill,
            A.VLLM_LATENCY_TIME_IN_MODEL_DECODE: decode,
            A.NODE: NODE,
            A.POOL: "energy",
            A.GPU_TYPE: "H100-SXM",
            A.TENSOR_PARALLEL: 2,
            A.ENGINE: "vllm-0",
        })
        span.end(end_time=int(end * 1e9))
    assert provider.force_flush(30_000)
    provider.shutdown()
    return last


def test_records_and_idle_share_the_agents_measured_joules(tmp_path: Path) -> None:
    store = tmp_path / "store.db"
    collector = CollectorService(CollectorConfig(
        http_port=0, grpc_port=None, store_path=str(store),
        cost=AttributorConfig(min_delay_seconds=0.5, tick_seconds=0.1)))
    collector.start()
    gpus = [FakeGpu(power_milliwatts=520_000, energy_clock=time.time),
            FakeGpu(power_milliwatts=310_000, energy_clock=time.time)]
    agent = AgentService(
        AgentConfig(listen="127.0.0.1:0", node=NODE, interval_seconds=0.05,
                    push_interval_seconds=0.1, collector_url=collector.http_url),
        nvml=FakeNvml(gpus))
    readings = collector.energy
    try:
        agent.start(serve=False)
        _wait_for(lambda: readings.known_until(NODE) is not None, "the agent's first push")
        first = readings.known_until(NODE)
        assert first is not None
        start = first + 0.2
        # the batch runs in real time: its spans are sent once its last request ended
        _wait_for(lambda: time.time() > start + 0.01 * REQUESTS + 2.5, "the batch to end")
        gpus[0].power_milliwatts = 610_000  # the load changes what the GPUs draw
        last_end = _emit_batch(f"{collector.http_url}/v1/traces", start)
        attributor = collector.attributor
        _wait_for(lambda: attributor.stats.records_out.value >= REQUESTS, "every record priced")
        ledger = attributor.ledger[NODE]
        _wait_for(lambda: (ledger.closed_until or 0.0) > last_end + 0.5,
                  "idle time after the batch closed")
    finally:
        agent.shutdown()
        collector.shutdown()
    assert ledger.window_start is not None and ledger.closed_until is not None
    metered = readings.joules(NODE, ledger.window_start, ledger.closed_until)
    assert metered is not None and ledger.modeled_seconds == 0.0
    reader = open_store_readonly(str(store))
    try:
        records = reader.records()
        idle_joules = reader.idle_energy_joules()
    finally:
        reader.shutdown()
    assert len(records) == REQUESTS
    assert {r.energy_provenance for r in records} == {ENERGY_MEASURED}
    busy = sum(r.energy_joules for r in records)
    assert idle_joules > 0
    assert busy + idle_joules == pytest.approx(metered, rel=1e-9)
    # the agent's counters rose by about the GPUs' power over the window
    watts = metered / (ledger.closed_until - ledger.window_start)
    assert 700.0 < watts < 1000.0
