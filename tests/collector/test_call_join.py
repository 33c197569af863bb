"""A call traced as two traces (a client or proxy that does not forward traceparent) is one
record: joined by its response id, counted once whichever half comes first or late."""

from __future__ import annotations

import pytest

from testkit.fakes.clock import FakeClock
from testkit.fakes.spans import new_trace_id, span
from tests.collector.cost.helpers import RecordingSink
from tokenpath import attributes as A
from tokenpath.collector.assembler import AssembledTrace
from tokenpath.collector.call_join import (
    ALONE,
    HOP_CLIENT,
    HOP_PROXY,
    JOINED,
    LATE,
    CallJoiner,
    JoinConfig,
)
from tokenpath.collector.mapping import map_calls
from tokenpath.collector.spans import SPAN_KIND_CLIENT, SPAN_KIND_SERVER, SpanEvent
from tokenpath.collector.stats import CollectorStats
from tokenpath.config import ConfigError
from tokenpath.records import RequestRecord
from tokenpath.stages import Provenance, StageId

RESPONSE_ID = "chatcmpl-5f0c"


def serving_record(response_id: str = RESPONSE_ID, start: float = 100.2,
                   end: float = 101.0) -> RequestRecord:
    """The gateway and engine of the call, in their own trace."""
    trace = new_trace_id()
    server = span(trace, "POST /v1/chat/completions", kind=SPAN_KIND_SERVER, start=start,
                  end=end, attributes={"http.route": "/v1/chat/completions",
                                       A.GEN_AI_RESPONSE_ID: response_id,
                                       "http.response.status_code": 200})
    engine = span(trace, A.VLLM_REQUEST_SPAN_NAME, parent=server.span_id, start=start + 0.1,
                  end=end - 0.1, attributes={
                      A.GEN_AI_REQUEST_ID: response_id,
                      A.VLLM_USAGE_PROMPT_TOKENS: 40, A.VLLM_USAGE_COMPLETION_TOKENS: 12,
                      A.VLLM_LATENCY_TIME_IN_QUEUE: 0.01,
                      A.VLLM_LATENCY_TIME_IN_MODEL_PREFILL: 0.05,
                      A.VLLM_LATENCY_TIME_IN_MODEL_DECODE: 0.4,
                      A.VLLM_LATENCY_TIME_TO_FIRST_TOKEN: 0.08})
    (record,) = map_calls(AssembledTrace(trace, [server, engine], True))
    return record


def client_record(response_id: str = RESPONSE_ID, start: float = 100.0, end: float = 101.3,
                  first_chunk: float | None = None) -> RequestRecord:
    """openai-v2 / OpenLLMetry: a `chat {model}` CLIENT span, nothing under it."""
    trace = new_trace_id()
    events = [] if first_chunk is None else [
        SpanEvent(A.OPENLLMETRY_CHUNK_EVENT, int((start + first_chunk) * 1e9), {})]
    client = span(trace, "chat m", kind=SPAN_KIND_CLIENT, start=start, end=end, events=events,
                  attributes={A.GEN_AI_OPERATION_NAME: "chat", A.GEN_AI_REQUEST_MODEL: "m",
                              A.GEN_AI_RESPONSE_ID: response_id,
                              A.GEN_AI_USAGE_INPUT_TOKENS: 41,
                              A.GEN_AI_USAGE_OUTPUT_TOKENS: 12})
    (record,) = map_calls(AssembledTrace(trace, [client], True))
    return record


def litellm_record(response_id: str = RESPONSE_ID) -> RequestRecord:
    """LiteLLM's proxy as its otel callback and the stock FastAPI instrumentation trace it
    (span names and nesting as a real litellm 1.108 proxy exported them)."""
    trace = new_trace_id()
    root = span(trace, "POST /v1/chat/completions", kind=SPAN_KIND_SERVER, start=99.9,
                end=101.2, attributes={"http.route": "/v1/chat/completions",
                                       "http.response.status_code": 200})
    deps = span(trace, "fastapi.dependencies", parent=root.span_id, start=99.91, end=100.0)
    proxy = span(trace, "Received Proxy Server Request", parent=deps.span_id,
                 kind=SPAN_KIND_SERVER, start=99.91, end=101.15,
                 attributes={"http.route": "/v1/chat/completions"})
    auth = span(trace, "auth", parent=proxy.span_id, start=99.91, end=99.95,
                attributes={"service": "auth"})
    router = span(trace, "router", parent=proxy.span_id, start=100.0, end=101.1,
                  attributes={"service": "router"})
    upstream = span(trace, "litellm_request", parent=proxy.span_id, start=100.05, end=101.05,
                    attributes={A.GEN_AI_RESPONSE_ID: response_id,
                                A.GEN_AI_OPERATION_NAME: "acompletion",
                                A.GEN_AI_USAGE_INPUT_TOKENS: 41,
                                A.GEN_AI_USAGE_OUTPUT_TOKENS: 12})
    raw = span(trace, "raw_gen_ai_request", parent=upstream.span_id, start=100.05, end=101.05)
    (record,) = map_calls(AssembledTrace(trace, [root, deps, proxy, auth, router, upstream,
                                                 raw], True))
    return record


def joiner(mode: str = "auto", wait: float = 10.0) -> tuple[CallJoiner, RecordingSink,
                                                             CollectorStats, FakeClock]:
    sink, stats, clock = RecordingSink(), CollectorStats(), FakeClock(1000.0)
    return CallJoiner(sink, JoinConfig(mode=mode, wait_seconds=wait), stats, clock), sink, \
        stats, clock


def test_the_mapper_marks_the_outer_hops_and_their_response_ids() -> None:
    assert client_record().outer_hop == HOP_CLIENT
    proxy = litellm_record()
    assert proxy.outer_hop == HOP_PROXY and proxy.response_id == RESPONSE_ID
    serving = serving_record()
    assert serving.outer_hop is None and serving.response_id == RESPONSE_ID


def test_litellm_router_and_gateway_exclude_the_upstream_wait() -> None:
    record = litellm_record()
    # router span 1.1 s holds the 1.0 s upstream call: 0.1 s of routing
    assert record.stages[StageId.ROUTER].seconds == pytest.approx(0.1)
    assert record.stages[StageId.AUTH_RATELIMIT].seconds == pytest.approx(0.04)
    # 1.3 s at the front door, less 1.0 s upstream, less auth and router
    assert record.stages[StageId.API_GATEWAY].seconds == pytest.approx(1.3 - 1.0 - 0.14)


def test_a_client_span_with_chunk_events_gives_the_client_ttft() -> None:
    assert client_record(first_chunk=0.25).ttft_seconds == pytest.approx(0.25)


def test_client_after_serving_in_auto_mode_is_late_and_not_a_second_request() -> None:
    join, sink, stats, _ = joiner()
    join.consume_record(serving_record())  # nothing outer seen yet: passes at once
    assert len(sink.records) == 1
    join.consume_record(client_record())
    assert len(sink.records) == 1 and stats.calls_joined[LATE] == 1


def test_once_active_serving_waits_for_its_client_and_one_record_goes_on() -> None:
    join, sink, stats, clock = joiner()
    join.consume_record(client_record("chatcmpl-warm"))  # activates; its inner never came
    serving = serving_record(start=100.2, end=101.0)
    join.consume_record(serving)
    assert sink.records == []  # held for its client
    clock.advance(2.0)
    join.consume_record(client_record(start=100.0, end=101.3, first_chunk=0.31))
    assert [r.record_id for r in sink.records] == [serving.record_id]
    merged = sink.records[0]
    assert stats.calls_joined[JOINED] == 1
    assert (merged.input_tokens, merged.output_tokens) == (40, 12)  # the engine's counts
    assert merged.stages[StageId.CLIENT_TOKENIZE].seconds == pytest.approx(0.2)
    assert merged.stages[StageId.CLIENT_DECODE].seconds == pytest.approx(0.3)
    assert merged.stages[StageId.CLIENT_DECODE].provenance is Provenance.DERIVED
    assert merged.ttft_seconds == pytest.approx(0.31)  # the client's own
    assert merged.start_unix == pytest.approx(100.0) and merged.end_unix == pytest.approx(101.3)
    assert len(merged.joined_trace_ids) == 1 and merged.joined_trace_ids[0] != merged.trace_id
    clock.advance(10.0)
    join.tick()  # the warm-up client record goes on alone
    assert stats.calls_joined[ALONE] == 1 and len(sink.records) == 2


def test_a_client_that_comes_first_waits_for_its_serving_side() -> None:
    join, sink, stats, _ = joiner()
    join.consume_record(client_record())
    assert sink.records == []
    join.consume_record(serving_record())
    assert len(sink.records) == 1 and stats.calls_joined[JOINED] == 1
    assert sink.records[0].outer_hop is None


def test_a_proxy_hop_adds_its_own_gateway_time_in_series() -> None:
    join, sink, _, _ = joiner(mode="always")
    serving = serving_record(start=100.1, end=101.0)
    gateway_alone = serving.stages[StageId.API_GATEWAY].seconds
    join.consume_record(serving)
    join.consume_record(litellm_record())
    (merged,) = sink.records
    assert merged.stages[StageId.API_GATEWAY].seconds == pytest.approx(
        gateway_alone + (1.3 - 1.0 - 0.14))
    assert merged.stages[StageId.ROUTER].seconds == pytest.approx(0.1)
    assert StageId.CLIENT_TOKENIZE not in merged.stages  # a proxy is not the client
    # no TTFT of its own: the serving side's plus the time before it began
    assert merged.ttft_seconds == pytest.approx(0.08 + (100.1 - 99.9))


def test_serving_records_with_no_client_go_on_after_the_wait() -> None:
    join, sink, _, clock = joiner(mode="always", wait=5.0)
    join.consume_record(serving_record("a"))
    clock.advance(4.9)
    join.tick()
    assert sink.records == []
    clock.advance(0.2)
    join.tick()
    assert len(sink.records) == 1


def test_off_mode_and_records_without_an_id_pass_at_once() -> None:
    join, sink, _, _ = joiner(mode="off")
    join.consume_record(client_record())
    assert len(sink.records) == 1
    join, sink, _, _ = joiner(mode="always")
    join.consume_record(RequestRecord(trace_id=new_trace_id()))
    assert len(sink.records) == 1


def test_shutdown_hands_on_what_it_holds() -> None:
    join, sink, _, _ = joiner(mode="always")
    join.consume_record(serving_record("x"))
    join.consume_record(client_record("y"))
    join.shutdown()
    join.shutdown()
    assert len(sink.records) == 2 and sink.shutdowns == 1


def test_bad_join_config_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"join\.mode"):
        JoinConfig(mode="sometimes").validate()
    with pytest.raises(ConfigError, match=r"join\.wait_seconds"):
        JoinConfig(wait_seconds=-1).validate()


def app_client_record(response_id: str = RESPONSE_ID) -> RequestRecord:
    """An app's own HTTP server span (not an LLM route) around its openai-v2 client span:
    the commonest setup; the client did not propagate."""
    trace = new_trace_id()
    app = span(trace, "POST /ask", kind=SPAN_KIND_SERVER, start=99.8, end=101.5,
               attributes={"http.route": "/ask", "http.response.status_code": 200})
    client = span(trace, "chat m", parent=app.span_id, kind=SPAN_KIND_CLIENT, start=100.0,
                  end=101.3, attributes={A.GEN_AI_OPERATION_NAME: "chat",
                                         A.GEN_AI_REQUEST_MODEL: "m",
                                         A.GEN_AI_RESPONSE_ID: response_id,
                                         A.GEN_AI_USAGE_INPUT_TOKENS: 41})
    (record,) = map_calls(AssembledTrace(trace, [app, client], True))
    return record


def test_a_client_under_an_apps_server_span_is_an_outer_hop_and_joins() -> None:
    outer = app_client_record()
    assert outer.outer_hop == HOP_CLIENT
    join, sink, stats, _ = joiner(mode="always")
    join.consume_record(serving_record())
    join.consume_record(outer)
    (merged,) = sink.records
    assert merged.input_tokens == 40 and stats.calls_joined[JOINED] == 1
    # the app's own time is not gateway time of the call
    assert merged.stages[StageId.API_GATEWAY].seconds == pytest.approx(0.9 - 0.7)


def test_a_client_then_a_proxy_then_the_gateway_untraced_is_one_record() -> None:
    join, sink, stats, _ = joiner(mode="always")
    join.consume_record(client_record())
    join.consume_record(litellm_record())
    join.consume_record(serving_record(start=100.1, end=101.0))
    (merged,) = sink.records
    assert stats.calls_joined[JOINED] == 2 and stats.calls_joined[ALONE] == 0
    assert merged.input_tokens == 40
    assert len(merged.joined_trace_ids) == 2
    assert StageId.ROUTER in merged.stages and StageId.CLIENT_TOKENIZE in merged.stages


def test_a_serving_half_after_its_outer_went_alone_is_counted_as_such() -> None:
    from tokenpath.collector.call_join import SERVING_AFTER_ALONE

    join, _, stats, clock = joiner(mode="always", wait=10.0)
    join.consume_record(client_record())
    clock.advance(10.5)
    join.tick()
    assert stats.calls_joined[ALONE] == 1
    clock.advance(0.5)
    join.consume_record(serving_record())
    assert stats.calls_joined[SERVING_AFTER_ALONE] == 1  # counted twice, and said so


def test_a_joined_record_is_judged_again_on_the_clients_first_token() -> None:
    from tokenpath.slo import OUTCOME_MET, OUTCOME_MISSED, SloClass, SloConfig, classify_record

    classes = SloConfig((SloClass("chat", ttft_seconds=0.3),))
    for slo, outcome in ((classes, OUTCOME_MISSED), (None, OUTCOME_MET)):
        sink, stats = RecordingSink(), CollectorStats()
        join = CallJoiner(sink, JoinConfig(), stats, FakeClock(1000.0), slo=slo)
        serving = serving_record()
        classify_record(serving, classes, lambda key: None)
        assert serving.ttft_seconds is not None and serving.ttft_seconds < 0.3
        assert serving.slo_outcome == OUTCOME_MET
        join.consume_record(client_record(first_chunk=0.6))  # the client waited 0.6 s
        join.consume_record(serving)
        (joined,) = sink.records
        assert joined.ttft_seconds == pytest.approx(0.6)
        assert (joined.slo, joined.slo_outcome) == ("chat", outcome)
