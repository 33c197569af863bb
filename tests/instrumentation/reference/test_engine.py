from __future__ import annotations

import asyncio

import pytest

from testkit.fakes.otel_sink import SpanSink
from tests.instrumentation.reference.support import run_async
from tokenpath import attributes as attr
from tokenpath.config import ConfigError
from tokenpath.instrumentation.reference.engine import (
    EngineConfig,
    EngineOverloaded,
    SimulatedEngine,
)
from tokenpath.roofline import roofline_for


async def _collect(engine: SimulatedEngine, prompt: list[int], max_tokens: int) -> list[int]:
    return [token async for token in engine.generate(prompt, max_tokens)]


def test_every_request_gets_its_tokens_even_when_blocks_run_out_and_preempt() -> None:
    sink = SpanSink()
    config = EngineConfig(kv_blocks=10, kv_block_tokens=4, time_scale=1e-4, max_num_seqs=8)

    async def run() -> list[list[int]]:
        engine = SimulatedEngine(config, tracer_provider=sink.provider)
        try:
            prompts = [[i] * 8 for i in range(4)]  # 2 blocks each; 12 outputs need 3 more
            return await asyncio.gather(*(_collect(engine, p, 12) for p in prompts))
        finally:
            await engine.shutdown()

    outputs = run_async(run)
    assert [len(o) for o in outputs] == [12] * 4
    spans = [s for s in sink.spans() if s.name == attr.VLLM_REQUEST_SPAN_NAME]
    assert len(spans) == 4
    assert sum(int((s.attributes or {}).get(attr.PREEMPTIONS, 0)) for s in spans) >= 1
    assert all((s.attributes or {})[attr.VLLM_USAGE_COMPLETION_TOKENS] == 12 for s in spans)


def test_batched_steps_are_shorter_than_running_the_requests_one_by_one() -> None:
    """Continuous batching: decode steps stream the weights once for the whole batch."""
    config = EngineConfig(time_scale=1e-3)

    async def busy(concurrent: bool) -> float:
        engine = SimulatedEngine(config)
        prompts = [[i] * 64 for i in range(8)]
        try:
            if concurrent:
                await asyncio.gather(*(_collect(engine, p, 16) for p in prompts))
            else:
                for p in prompts:
                    await _collect(engine, p, 16)
            return engine.steps
        finally:
            await engine.shutdown()

    assert run_async(lambda: busy(True)) < run_async(lambda: busy(False)) / 4


def test_a_prompt_larger_than_the_cache_is_refused() -> None:
    async def run() -> None:
        engine = SimulatedEngine(EngineConfig(kv_blocks=4, kv_block_tokens=4))
        with pytest.raises(EngineOverloaded):
            await _collect(engine, list(range(40)), 4)
        await engine.shutdown()

    run_async(run)


def test_step_time_follows_the_roofline() -> None:
    roofline = roofline_for("H100-SXM", "llama-3.1-8b")
    one = roofline.step_seconds(roofline.decode_flops(1000), roofline.decode_bytes(1000), 1)
    many = roofline.step_seconds(32 * roofline.decode_flops(1000),
                                 32 * roofline.decode_bytes(1000), 32)
    assert many < 4 * one  # decode is memory-bound: the weights dominate and are shared


def test_engine_config_validation_names_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        EngineConfig(gpu="TPU").validate()
    assert info.value.key == "gpu"
    with pytest.raises(ConfigError) as info:
        EngineConfig(time_scale=0).validate()
    assert info.value.key == "time_scale"
