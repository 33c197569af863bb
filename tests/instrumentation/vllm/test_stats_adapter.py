"""Reading vLLM 0.32's stats objects (shapes copied from vllm/v1/metrics/stats.py)."""

from __future__ import annotations

from types import SimpleNamespace

from tokenpath.instrumentation.vllm.stats_adapter import (
    engine_step_from_stats,
    finished_requests_from_stats,
)


def iteration(ts: float = 10.0, computed: int = 0, generated: int = 0,
              finished: list[SimpleNamespace] | None = None) -> SimpleNamespace:
    return SimpleNamespace(
        iteration_timestamp=ts,
        num_generation_tokens=generated,
        prompt_token_stats=SimpleNamespace(computed=computed, total=computed),
        finished_requests=finished or [],
    )


def test_measured_step_from_iteration_details() -> None:
    details = SimpleNamespace(num_ctx_requests=1, num_ctx_tokens=70, num_generation_requests=3,
                              num_generation_tokens=3, elapsed_ms=12.5, is_dummy=False)
    step = engine_step_from_stats(SimpleNamespace(iteration_details=details), iteration())
    assert step is not None
    assert (step.prefill_tokens, step.decode_tokens, step.batch_requests) == (70, 3, 4)
    assert step.seconds == 0.0125
    assert step.timestamp_unix == 10.0


def test_fallback_step_without_details_has_no_measured_time() -> None:
    sched = SimpleNamespace(iteration_details=None, num_running_reqs=2)
    step = engine_step_from_stats(sched, iteration(computed=40, generated=2))
    assert step is not None
    assert (step.prefill_tokens, step.decode_tokens, step.batch_requests) == (40, 2, 2)
    assert step.seconds is None


def test_idle_record_is_not_a_step() -> None:
    assert engine_step_from_stats(None, iteration()) is None
    assert engine_step_from_stats(None, None) is None


def test_finished_requests_keep_id_cache_and_preemptions() -> None:
    done = SimpleNamespace(request_id="cmpl-1-0", num_cached_tokens=64, num_preemptions=2,
                           num_prompt_tokens=90, num_generation_tokens=8, inference_time=0.3,
                           finish_reason="length")
    anonymous = SimpleNamespace(**{**done.__dict__, "request_id": None})
    (record,) = finished_requests_from_stats(iteration(ts=20.0, finished=[done, anonymous]))
    assert record.request_id == "cmpl-1-0"
    assert (record.cached_tokens, record.preemptions, record.prompt_tokens) == (64, 2, 90)
    assert record.finished_unix == 20.0
    assert record.inference_seconds == 0.3
