"""Engine-step bookkeeping for the vLLM plugin: a bounded window of recent steps, the
per-request summary over the steps a request was in flight for, and interval totals.

Everything here runs on the plugin's export thread, never on vLLM's engine loop.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from tokenpath.stages import Provenance

STEP_SOURCE_MEASURED = Provenance.MEASURED.value
STEP_SOURCE_DERIVED = Provenance.DERIVED.value


@dataclass(frozen=True, slots=True)
class EngineStep:
    """One engine iteration as the stat logger saw it.

    ``timestamp_unix``: when the frontend processed the step's output (vLLM's
    ``IterationStats.iteration_timestamp``). ``seconds``: the step's duration when vLLM
    measured it (``--enable-logging-iteration-details``), else ``None``.
    """

    timestamp_unix: float
    prefill_tokens: int
    decode_tokens: int
    batch_requests: int
    seconds: float | None


@dataclass(frozen=True, slots=True)
class StepSummary:
    steps: int
    seconds: float
    prefill_tokens: int
    decode_tokens: int
    max_batch_requests: int
    seconds_source: str


class StepWindow:
    """Remembers the last ``capacity`` steps (oldest first) and the totals since the last
    :meth:`take_interval`."""

    def __init__(self, capacity: int) -> None:
        self._steps: deque[EngineStep] = deque(maxlen=capacity)
        self._durations: deque[float] = deque(maxlen=capacity)
        self._interval: list[float] = []
        self._interval_steps = 0
        self._interval_prefill = 0
        self._interval_decode = 0
        self._interval_max_batch = 0
        self._interval_measured = True
        self._last_timestamp: float | None = None

    def add(self, step: EngineStep) -> None:
        if step.seconds is not None:
            duration = step.seconds
        elif self._last_timestamp is not None:
            duration = max(0.0, step.timestamp_unix - self._last_timestamp)
        else:
            duration = 0.0
        self._last_timestamp = step.timestamp_unix
        self._steps.append(step)
        self._durations.append(duration)
        self._interval_steps += 1
        self._interval.append(duration)
        self._interval_prefill += step.prefill_tokens
        self._interval_decode += step.decode_tokens
        self._interval_max_batch = max(self._interval_max_batch, step.batch_requests)
        self._interval_measured = self._interval_measured and step.seconds is not None

    def summarize(self, start_unix: float, end_unix: float) -> StepSummary:
        """The steps whose timestamp lies in ``[start_unix, end_unix]``."""
        steps = 0
        seconds = 0.0
        prefill = decode = max_batch = 0
        measured = True
        for step, duration in zip(reversed(self._steps), reversed(self._durations), strict=True):
            if step.timestamp_unix > end_unix:
                continue
            if step.timestamp_unix < start_unix:
                break
            steps += 1
            seconds += duration
            prefill += step.prefill_tokens
            decode += step.decode_tokens
            max_batch = max(max_batch, step.batch_requests)
            measured = measured and step.seconds is not None
        source = STEP_SOURCE_MEASURED if measured and steps else STEP_SOURCE_DERIVED
        return StepSummary(steps, seconds, prefill, decode, max_batch, source)

    def take_interval(self) -> StepSummary | None:
        """Totals since the previous call (``None`` when no step ran), then reset them."""
        if self._interval_steps == 0:
            return None
        source = STEP_SOURCE_MEASURED if self._interval_measured else STEP_SOURCE_DERIVED
        summary = StepSummary(
            self._interval_steps,
            sum(self._interval),
            self._interval_prefill,
            self._interval_decode,
            self._interval_max_batch,
            source,
        )
        self._interval = []
        self._interval_steps = self._interval_prefill = self._interval_decode = 0
        self._interval_max_batch = 0
        self._interval_measured = True
        return summary
