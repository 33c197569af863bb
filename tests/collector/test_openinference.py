"""OpenInference's client spans (openinference-instrumentation-openai 0.1.66 on openai 3.x):
one INTERNAL ``ChatCompletion`` span per call, ``openinference.span.kind=LLM``, the model in
``llm.model_name``, tokens in ``llm.token_count.*``, no response id, and (openai 3.x sends
through httpx2, which nothing instruments) no traceparent to the server. Each call is a
client call span; it joins the engine record it wraps by what both halves know, and where
two serving records fit it joins neither."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from testkit.fakes.clock import FakeClock
from testkit.fakes.spans import new_trace_id, span
from testkit.support.otlp import export_request, make_span
from testkit.support.otlp import new_trace_id as new_trace_bytes
from tests.collector.conftest import ServiceFactory, wait_for
from tests.collector.cost.helpers import RecordingSink
from tokenpath import attributes as A
from tokenpath import metric_names as M
from tokenpath.collector.assembler import AssembledTrace
from tokenpath.collector.call_join import (
    ALONE,
    AMBIGUOUS,
    HOP_CLIENT,
    JOINED,
    LATE,
    SERVING_AFTER_ALONE,
    CallJoiner,
    JoinConfig,
)
from tokenpath.collector.calls import is_call_span, is_client_call_span
from tokenpath.collector.limits import IngestLimits
from tokenpath.collector.mapping import map_calls
from tokenpath.collector.receivers.otlp_decode import decode_traces
from tokenpath.collector.spans import SPAN_KIND_SERVER, SpanEvent
from tokenpath.collector.stats import CollectorStats
from tokenpath.config import ConfigError
from tokenpath.records import (
    CACHE_SOURCE_CLIENT,
    CACHE_SOURCE_ENGINE,
    CACHE_SOURCE_GATEWAY,
    RequestRecord,
)
from tokenpath.stages import Provenance, StageId

MODEL = "tiny-llama"
PROMPT = "SECRET-PROMPT what does the scheduler queue measure?"
COMPLETION = "SECRET-COMPLETION it measures"
SPAN_KIND_INTERNAL = 1


def openinference_attributes(prompt_tokens: int = 40, completion_tokens: int = 12,
                             model: str = MODEL, cached: int | None = 32) -> dict[str, Any]:
    """A ``ChatCompletion`` span's attributes as openinference-instrumentation-openai 0.1.66
    sets them, content keys included."""
    attributes: dict[str, Any] = {
        A.OPENINFERENCE_SPAN_KIND: A.OPENINFERENCE_KIND_LLM,
        A.OPENINFERENCE_MODEL_NAME: model,
        A.OPENINFERENCE_SYSTEM: "openai",
        A.OPENINFERENCE_INVOCATION_PARAMETERS: json.dumps(
            {"model": model, "max_tokens": completion_tokens}),
        A.OPENINFERENCE_PROMPT_TOKENS: prompt_tokens,
        A.OPENINFERENCE_COMPLETION_TOKENS: completion_tokens,
        A.OPENINFERENCE_TOTAL_TOKENS: prompt_tokens + completion_tokens,
        "input.mime_type": "application/json",
        "output.mime_type": "application/json",
        "input.value": json.dumps({"messages": [{"role": "user", "content": PROMPT}],
                                   "model": model}),
        "output.value": json.dumps({"choices": [{"message": {"content": COMPLETION}}]}),
        "llm.input_messages.0.message.role": "user",
        "llm.input_messages.0.message.content": PROMPT,
        "llm.output_messages.0.message.role": "assistant",
        "llm.output_messages.0.message.content": COMPLETION,
    }
    if cached is not None:
        attributes[A.OPENINFERENCE_CACHE_READ_TOKENS] = cached
    return attributes


def openinference_record(start: float = 100.0, end: float = 101.3, *,
                         first_token: float | None = None, **kwargs: Any) -> RequestRecord:
    trace = new_trace_id()
    events = [] if first_token is None else [
        SpanEvent(A.OPENINFERENCE_FIRST_TOKEN_EVENT, int((start + first_token) * 1e9), {})]
    client = span(trace, "ChatCompletion", kind=SPAN_KIND_INTERNAL, start=start, end=end,
                  events=events, attributes=openinference_attributes(**kwargs))
    (record,) = map_calls(AssembledTrace(trace, [client], True))
    return record


def vllm_record(start: float = 100.2, end: float = 101.0, prompt_tokens: int = 40,
                completion_tokens: int = 12, request_id: str = "chatcmpl-8d0ad4e7",
                model: str | None = None, cached: int | None = None) -> RequestRecord:
    """vLLM's llm_request in a trace of its own (no traceparent reached it), with the
    tokenpath plugin's annotation when ``model`` or ``cached`` is given."""
    trace = new_trace_id()
    engine = span(trace, A.VLLM_REQUEST_SPAN_NAME, kind=SPAN_KIND_SERVER, start=start, end=end,
                  attributes={A.GEN_AI_REQUEST_ID: request_id,
                              A.VLLM_USAGE_PROMPT_TOKENS: prompt_tokens,
                              A.VLLM_USAGE_COMPLETION_TOKENS: completion_tokens,
                              A.VLLM_LATENCY_TIME_IN_QUEUE: 0.01,
                              A.VLLM_LATENCY_TIME_IN_MODEL_PREFILL: 0.05,
                              A.VLLM_LATENCY_TIME_IN_MODEL_DECODE: 0.4,
                              A.VLLM_LATENCY_TIME_TO_FIRST_TOKEN: 0.08})
    annotation: dict[str, Any] = {A.GEN_AI_REQUEST_ID: request_id}
    if model is not None:
        annotation[A.GEN_AI_RESPONSE_MODEL] = model
    if cached is not None:
        annotation[A.CACHED_TOKENS] = cached
    annotations = [annotation] if len(annotation) > 1 else []
    (record,) = map_calls(AssembledTrace(trace, [engine], True, annotations))
    return record


def joiner(mode: str = "always", wait: float = 10.0, skew: float = 0.25) -> tuple[
        CallJoiner, RecordingSink, CollectorStats, FakeClock]:
    sink, stats, clock = RecordingSink(), CollectorStats(), FakeClock(1000.0)
    config = JoinConfig(mode=mode, wait_seconds=wait, clock_skew_seconds=skew)
    return CallJoiner(sink, config, stats, clock), sink, stats, clock


# --- the span is a client call ---------------------------------------------------------


def test_an_openinference_llm_span_is_a_client_call_of_its_own() -> None:
    client = span(new_trace_id(), "ChatCompletion", kind=SPAN_KIND_INTERNAL,
                  attributes=openinference_attributes())
    assert is_client_call_span(client) and is_call_span(client)
    chain = span(new_trace_id(), "RunnableSequence", kind=SPAN_KIND_INTERNAL,
                 attributes={A.OPENINFERENCE_SPAN_KIND: "CHAIN"})
    assert not is_call_span(chain)


def test_its_record_names_the_model_and_reads_tokens_in_its_spelling() -> None:
    record = openinference_record(first_token=0.3)
    assert record.model == MODEL
    assert (record.input_tokens, record.output_tokens) == (40, 12)
    assert record.cache_read_tokens == 32 and record.cache_read_source == CACHE_SOURCE_CLIENT
    assert record.outer_hop == HOP_CLIENT and record.response_id is None
    assert (record.client_start_unix, record.client_end_unix) == (100.0, 101.3)
    assert record.ttft_seconds == pytest.approx(0.3)  # its "First Token Stream Event"


def test_the_content_keys_are_dropped_on_ingest() -> None:
    attributes = openinference_attributes()
    content = [k for k in attributes if k.startswith(A.GEN_AI_CONTENT_PREFIXES)]
    assert sorted(content) == sorted([
        "input.value", "output.value", "llm.input_messages.0.message.role",
        "llm.input_messages.0.message.content", "llm.output_messages.0.message.role",
        "llm.output_messages.0.message.content"])
    request = export_request([make_span(new_trace_bytes(), name="ChatCompletion",
                                        attrs=attributes)])
    decoded = decode_traces(request, IngestLimits())
    (kept,) = decoded.spans
    assert decoded.content_attributes_dropped == len(content)
    assert not any(PROMPT in str(v) or COMPLETION in str(v) for v in kept.attributes.values())
    for key in (A.OPENINFERENCE_MODEL_NAME, A.OPENINFERENCE_PROMPT_TOKENS,
                A.OPENINFERENCE_COMPLETION_TOKENS, A.OPENINFERENCE_CACHE_READ_TOKENS,
                A.OPENINFERENCE_SPAN_KIND):
        assert key in kept.attributes


# --- the join without a response id ------------------------------------------------------


def test_a_client_call_joins_the_engine_record_it_wraps() -> None:
    join, sink, stats, clock = joiner()
    serving = vllm_record()
    assert serving.model == "unknown"  # vLLM's llm_request names none
    join.consume_record(serving)
    assert sink.records == []  # held for its client half
    clock.advance(1.5)
    join.consume_record(openinference_record(first_token=0.31))
    (merged,) = sink.records
    assert merged.record_id == serving.record_id and stats.calls_joined[JOINED] == 1
    assert merged.model == MODEL  # named by the client span
    assert (merged.input_tokens, merged.output_tokens) == (40, 12)
    assert merged.cache_read_tokens == 32 and merged.cache_read_source == CACHE_SOURCE_CLIENT
    assert merged.stages[StageId.CLIENT_TOKENIZE].seconds == pytest.approx(0.2)
    assert merged.stages[StageId.CLIENT_DECODE].seconds == pytest.approx(0.3)
    assert merged.stages[StageId.CLIENT_DECODE].provenance is Provenance.DERIVED
    assert merged.ttft_seconds == pytest.approx(0.31)
    assert merged.outer_hop is None and len(merged.joined_trace_ids) == 1
    clock.advance(60.0)
    join.tick()
    assert len(sink.records) == 1 and stats.calls_joined[ALONE] == 0


def test_a_client_that_comes_first_waits_and_the_engines_own_facts_win() -> None:
    join, sink, stats, _ = joiner(mode="auto")
    join.consume_record(openinference_record())  # activates auto mode
    assert sink.records == []
    join.consume_record(vllm_record(model=MODEL, cached=16))
    (merged,) = sink.records
    assert stats.calls_joined[JOINED] == 1 and merged.model == MODEL
    assert merged.cache_read_tokens == 16 and merged.cache_read_source == CACHE_SOURCE_ENGINE
    assert merged.ttft_seconds == pytest.approx(0.08 + 0.2)  # the engine's plus the lead


def test_a_client_after_its_serving_record_went_on_is_late_not_a_second_request() -> None:
    join, sink, stats, _ = joiner(mode="auto")
    join.consume_record(vllm_record())  # nothing outer seen yet: passes at once
    join.consume_record(openinference_record())
    assert len(sink.records) == 1 and stats.calls_joined[LATE] == 1


def test_two_serving_records_that_fit_join_neither_and_nothing_is_counted_twice() -> None:
    join, sink, stats, clock = joiner()
    first = vllm_record(start=100.2, end=100.6, request_id="chatcmpl-a")
    second = vllm_record(start=100.7, end=101.1, request_id="chatcmpl-b")
    join.consume_record(first)
    join.consume_record(second)
    join.consume_record(openinference_record(start=100.0, end=101.3))
    assert stats.calls_joined[AMBIGUOUS] == 1 and stats.calls_joined[JOINED] == 0
    clock.advance(11.0)
    join.tick()
    assert sorted(r.record_id for r in sink.records) == sorted(
        [first.record_id, second.record_id])
    assert all(not r.joined_trace_ids and r.model == "unknown" for r in sink.records)
    assert stats.calls_joined[ALONE] == 0


def test_two_held_clients_that_fit_one_serving_record_join_neither() -> None:
    join, sink, stats, clock = joiner()
    join.consume_record(openinference_record(start=100.0, end=101.3))
    join.consume_record(openinference_record(start=100.1, end=101.2))
    serving = vllm_record()
    join.consume_record(serving)
    assert stats.calls_joined[AMBIGUOUS] == 2
    clock.advance(11.0)
    join.tick()
    assert [r.record_id for r in sink.records] == [serving.record_id]
    assert not sink.records[0].joined_trace_ids


def test_the_interval_must_hold_the_serving_side_within_the_clock_skew() -> None:
    # the serving side seems to start 0.2 s before the client: within 0.25 s of skew
    join, sink, stats, _ = joiner(skew=0.25)
    join.consume_record(vllm_record(start=99.8, end=101.0))
    join.consume_record(openinference_record(start=100.0, end=101.3))
    assert stats.calls_joined[JOINED] == 1 and len(sink.records) == 1
    # 0.4 s before: not this client's call; both go on, the client alone after its wait
    join, sink, stats, clock = joiner(skew=0.25)
    join.consume_record(vllm_record(start=99.6, end=101.0))
    join.consume_record(openinference_record(start=100.0, end=101.3))
    clock.advance(11.0)
    join.tick()
    assert stats.calls_joined[JOINED] == 0 and stats.calls_joined[ALONE] == 1
    assert len(sink.records) == 2


@pytest.mark.parametrize(("client", "served"), [
    ({"prompt_tokens": 41}, None), ({"completion_tokens": 11}, None),
    ({"model": "another-model"}, MODEL)])
def test_different_tokens_or_a_different_named_model_do_not_fit(
        client: dict[str, Any], served: str | None) -> None:
    join, _, stats, clock = joiner()
    join.consume_record(vllm_record(model=served))
    join.consume_record(openinference_record(**client))
    clock.advance(11.0)
    join.tick()
    assert stats.calls_joined[JOINED] == 0 and stats.calls_joined[ALONE] == 1


def test_a_serving_record_after_its_client_went_alone_is_counted_as_such() -> None:
    join, _, stats, clock = joiner(wait=5.0)
    join.consume_record(openinference_record())
    clock.advance(5.5)
    join.tick()
    assert stats.calls_joined[ALONE] == 1
    join.consume_record(vllm_record())
    assert stats.calls_joined[SERVING_AFTER_ALONE] == 1


def test_a_client_with_no_tokens_passes_alone_at_once() -> None:
    join, sink, _, _ = joiner()
    join.consume_record(openinference_record(prompt_tokens=0, completion_tokens=0, cached=None))
    assert len(sink.records) == 1


def test_the_clock_skew_setting_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"join\.clock_skew_seconds"):
        JoinConfig(clock_skew_seconds=-0.1).validate()


# --- model and cached-token sources -----------------------------------------------------


def _gateway_and_engine(gateway: dict[str, Any], annotation: dict[str, Any] | None = None,
                        client: dict[str, Any] | None = None) -> RequestRecord:
    trace = new_trace_id()
    spans = []
    parent = ""
    if client is not None:
        top = span(trace, "chat", kind=3, start=99.9, end=101.1, attributes=client)
        spans.append(top)
        parent = top.span_id
    server = span(trace, "POST /v1/chat/completions", parent=parent, kind=SPAN_KIND_SERVER,
                  start=100.0, end=101.0, attributes={"http.route": "/v1/chat/completions",
                                                      **gateway})
    engine = span(trace, A.VLLM_REQUEST_SPAN_NAME, parent=server.span_id, start=100.1,
                  end=100.9, attributes={A.GEN_AI_REQUEST_ID: "chatcmpl-1",
                                         A.VLLM_USAGE_PROMPT_TOKENS: 40,
                                         A.VLLM_USAGE_COMPLETION_TOKENS: 12})
    annotations = [] if annotation is None else [{A.GEN_AI_REQUEST_ID: "chatcmpl-1",
                                                  **annotation}]
    (record,) = map_calls(AssembledTrace(trace, [*spans, server, engine], True, annotations))
    return record


def test_the_model_is_the_engines_then_the_gateways_then_the_clients() -> None:
    client = {A.GEN_AI_OPERATION_NAME: "chat", A.GEN_AI_REQUEST_MODEL: "client-alias"}
    gateway = {A.GEN_AI_REQUEST_MODEL: "gateway-name"}
    engine = {A.GEN_AI_RESPONSE_MODEL: "served-name"}
    assert _gateway_and_engine(gateway, engine, client).model == "served-name"
    assert _gateway_and_engine(gateway, None, client).model == "gateway-name"
    assert _gateway_and_engine({}, None, client).model == "client-alias"
    assert _gateway_and_engine({}).model == "unknown"


def test_the_cached_tokens_say_where_they_came_from_the_engines_first() -> None:
    gateway = {A.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: 16}
    record = _gateway_and_engine(gateway, {A.CACHED_TOKENS: 32})
    assert (record.cache_read_tokens, record.cache_read_source) == (32, CACHE_SOURCE_ENGINE)
    record = _gateway_and_engine(gateway)
    assert (record.cache_read_tokens, record.cache_read_source) == (16, CACHE_SOURCE_GATEWAY)
    record = _gateway_and_engine({})
    assert (record.cache_read_tokens, record.cache_read_source) == (0, None)
    assert RequestRecord.from_json(record.to_json()).cache_read_source is None
    joined = RequestRecord.from_json(_gateway_and_engine(gateway).to_json())
    assert joined.cache_read_source == CACHE_SOURCE_GATEWAY


# --- through a collector -----------------------------------------------------------------


def test_a_collector_makes_one_record_of_the_two_traces(make_service: ServiceFactory) -> None:
    service = make_service(join=JoinConfig(mode="always", wait_seconds=5.0))
    start = 1_700_000_000_000_000_000
    client = make_span(new_trace_bytes(), name="ChatCompletion", start_ns=start,
                       duration_ns=1_300_000_000, attrs=openinference_attributes())
    engine = make_span(new_trace_bytes(), name=A.VLLM_REQUEST_SPAN_NAME, kind=SPAN_KIND_SERVER,
                       start_ns=start + 200_000_000, duration_ns=800_000_000,
                       attrs={A.GEN_AI_REQUEST_ID: "chatcmpl-e2e",
                              A.VLLM_USAGE_PROMPT_TOKENS: 40,
                              A.VLLM_USAGE_COMPLETION_TOKENS: 12})
    for spans in ([engine], [client]):
        response = httpx.post(f"{service.http_url}/v1/traces",
                              content=export_request(spans).SerializeToString(),
                              headers={"Content-Type": "application/x-protobuf"})
        assert response.status_code == 200
    wait_for(lambda: service.store.count() == 1)
    (record,) = httpx.get(f"{service.http_url}/api/requests").json()
    assert record["model"] == MODEL and record["joined_trace_ids"]
    assert (record["input_tokens"], record["output_tokens"]) == (40, 12)
    assert StageId.CLIENT_TOKENIZE.value in record["stages"]
    metrics = httpx.get(f"{service.http_url}/metrics").text
    assert f'{M.CALLS_JOINED.series}{{outcome="joined"}} 1.0' in metrics
    assert PROMPT not in str(record) and COMPLETION not in str(record)


# --- OpenLIT: its CLIENT span propagates, straight to the engine ----------------------------


def test_a_client_span_straight_around_the_engine_gives_the_client_stages_and_ttft() -> None:
    """OpenLIT 1.45 on openai 2.x: the client's CLIENT span and vLLM's llm_request in one
    trace, no gateway between; OpenLIT's own first-token time on the client span."""
    trace = new_trace_id()
    client = span(trace, f"chat {MODEL}", kind=3, start=100.0, end=101.3, attributes={
        A.GEN_AI_OPERATION_NAME: "chat", A.GEN_AI_REQUEST_MODEL: MODEL,
        A.GEN_AI_RESPONSE_ID: "chatcmpl-9", A.GEN_AI_USAGE_INPUT_TOKENS: 40,
        A.GEN_AI_USAGE_OUTPUT_TOKENS: 12, A.OPENLIT_CLIENT_TTFT: 0.27})
    engine = span(trace, A.VLLM_REQUEST_SPAN_NAME, parent=client.span_id,
                  kind=SPAN_KIND_SERVER, start=100.2, end=101.0,
                  attributes={A.GEN_AI_REQUEST_ID: "chatcmpl-9",
                              A.VLLM_USAGE_PROMPT_TOKENS: 40,
                              A.VLLM_USAGE_COMPLETION_TOKENS: 12,
                              A.VLLM_LATENCY_TIME_TO_FIRST_TOKEN: 0.08})
    (record,) = map_calls(AssembledTrace(trace, [client, engine], True))
    assert record.outer_hop is None and record.model == MODEL
    assert record.stages[StageId.CLIENT_TOKENIZE].seconds == pytest.approx(0.2)
    assert record.stages[StageId.CLIENT_DECODE].seconds == pytest.approx(0.3)
    assert record.ttft_seconds == pytest.approx(0.27)
