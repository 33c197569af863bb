"""Reads vLLM's ``SchedulerStats`` / ``IterationStats`` (duck-typed, so this module imports
without vLLM) into the plugin's small frozen records. Runs on vLLM's loop: cheap only."""

from __future__ import annotations

import time
from typing import Any

from tokenpath.instrumentation.vllm.exporter import FinishedRequest
from tokenpath.instrumentation.vllm.steps import EngineStep


def engine_step_from_stats(scheduler_stats: Any, iteration_stats: Any) -> EngineStep | None:
    """The step a ``record()`` call describes, or ``None`` when it describes no work.

    With ``--enable-logging-iteration-details`` vLLM measures each step (scheduled
    context/generation tokens and requests, elapsed time); without it the frontend's
    iteration stats give the prefill tokens computed and tokens generated, and the step
    time is derived from the gap between iteration timestamps.
    """
    details = getattr(scheduler_stats, "iteration_details", None)
    timestamp = (
        float(iteration_stats.iteration_timestamp) if iteration_stats is not None else time.time()
    )
    if details is not None and not details.is_dummy:
        return EngineStep(
            timestamp_unix=timestamp,
            prefill_tokens=int(details.num_ctx_tokens),
            decode_tokens=int(details.num_generation_tokens),
            batch_requests=int(details.num_ctx_requests + details.num_generation_requests),
            seconds=float(details.elapsed_ms) / 1000.0,
        )
    if iteration_stats is None:
        return None
    prefill = int(getattr(iteration_stats.prompt_token_stats, "computed", 0))
    decode = int(iteration_stats.num_generation_tokens)
    if prefill == 0 and decode == 0:
        return None
    running = int(getattr(scheduler_stats, "num_running_reqs", 0) or 0)
    return EngineStep(timestamp, prefill, decode, running, None)


def finished_requests_from_stats(iteration_stats: Any) -> list[FinishedRequest]:
    if iteration_stats is None:
        return []
    finished_at = float(iteration_stats.iteration_timestamp)
    out: list[FinishedRequest] = []
    for stats in iteration_stats.finished_requests:
        if stats.request_id is None:
            continue
        out.append(
            FinishedRequest(
                request_id=str(stats.request_id),
                finished_unix=finished_at,
                cached_tokens=int(stats.num_cached_tokens),
                preemptions=int(stats.num_preemptions),
                prompt_tokens=int(stats.num_prompt_tokens),
                generation_tokens=int(stats.num_generation_tokens),
                inference_seconds=max(0.0, float(stats.inference_time)),
                finish_reason=str(stats.finish_reason),
            )
        )
    return out
