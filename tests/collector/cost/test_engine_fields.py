"""The engine facts the attributor needs beyond the timeline: the engine span's start and
the engine's own step-time sum (tokenpath.engine.step_seconds)."""

from __future__ import annotations

import math

import pytest

from testkit.fakes.clock import FakeClock
from testkit.fakes.spans import new_trace_id, span
from tokenpath import attributes as A
from tokenpath.collector.assembler import AssembledTrace
from tokenpath.collector.cost.attributor import AttributorConfig, CostAttributor
from tokenpath.collector.cost.prices import load_price_sheet
from tokenpath.collector.mapping import map_trace
from tokenpath.collector.spans import SPAN_KIND_SERVER
from tokenpath.records import RequestRecord

from .helpers import RecordingSink

ATTRS = {
    A.GEN_AI_REQUEST_MODEL: "llama-3.1-8b",
    A.VLLM_USAGE_PROMPT_TOKENS: 120,
    A.VLLM_USAGE_COMPLETION_TOKENS: 11,
    A.VLLM_LATENCY_TIME_IN_QUEUE: 0.004,
    A.VLLM_LATENCY_TIME_IN_MODEL_PREFILL: 0.03,
    A.VLLM_LATENCY_TIME_IN_MODEL_DECODE: 0.2,
}


def _map(attributes: dict[str, object]) -> RequestRecord:
    tid = new_trace_id()
    engine = span(tid, A.VLLM_REQUEST_SPAN_NAME, kind=SPAN_KIND_SERVER, start=100.0,
                  end=100.26, attributes=attributes)
    record = map_trace(AssembledTrace(tid, [engine], True, []))
    assert record is not None
    return record


def test_mapper_keeps_engine_start_and_step_seconds() -> None:
    record = _map({**ATTRS, A.STEP_SECONDS: 0.2})
    assert record.engine_start_unix == pytest.approx(100.0)
    assert record.engine_step_seconds == pytest.approx(0.2)
    assert _map(ATTRS).engine_step_seconds is None
    again = RequestRecord.from_json(record.to_json())
    assert again.engine_step_seconds == pytest.approx(0.2)
    assert again.engine_start_unix == pytest.approx(100.0)


def test_mapper_keeps_the_engine_step_count() -> None:
    record = _map({**ATTRS, A.STEP_COUNT: 14})
    assert record.engine_steps == 14
    assert RequestRecord.from_json(record.to_json()).engine_steps == 14
    assert _map(ATTRS).engine_steps is None


def test_a_one_token_request_counts_its_prefill_steps_from_the_step_count() -> None:
    """No decode to time one step by: the engine's step count, less decode steps (none),
    gives its chunked prefill's steps, as its own measured dispatch would."""
    from tokenpath.collector.cost.attributor import _prefill_steps
    from tokenpath.records import PhaseShare, StageTiming
    from tokenpath.stages import Phase, Provenance, StageId

    record = _map({**ATTRS, A.VLLM_USAGE_COMPLETION_TOKENS: 1, A.STEP_COUNT: 3})
    record.stages[StageId.GPU_DISPATCH] = StageTiming(
        StageId.GPU_DISPATCH, 0.0045, Provenance.MEASURED,
        phases={Phase.PREFILL: PhaseShare(0.0045)})
    assert _prefill_steps(record) == 3.0
    record.engine_steps = None
    assert _prefill_steps(record) is None


def test_steps_shorter_than_in_model_time_leave_the_gap_idle() -> None:
    record = _map({**ATTRS, A.STEP_SECONDS: 0.23 * 0.75})
    sink = RecordingSink()
    prices = load_price_sheet()
    cost = CostAttributor(sink, prices, clock=FakeClock(),
                          config=AttributorConfig(tick_seconds=0))
    cost.consume_record(record)
    cost.shutdown()
    per_second = prices.gpus["H100-SXM"].dollars_per_second
    assert math.isclose(cost.ledger["unknown"].in_model_fraction, 0.75)
    assert math.isclose(sink.records[0].gpu_cost_dollars, 0.75 * 0.23 * per_second,
                        rel_tol=1e-9)
    assert math.isclose(sink.idle_dollars, 0.25 * 0.23 * per_second, rel_tol=1e-9)
