"""One record per LLM call (collector/calls.py, mapping.map_calls): agent workflows,
retries, disaggregated prefill/decode and the single-call trace."""

from __future__ import annotations

import httpx
import pytest

from testkit.fakes.spans import new_trace_id, span
from testkit.support.otlp import export_request, make_span
from testkit.support.otlp import new_trace_id as new_trace_bytes
from tests.collector.conftest import ServiceFactory, wait_for
from tokenpath import attributes as A
from tokenpath.collector.assembler import AssembledTrace
from tokenpath.collector.call_join import JoinConfig
from tokenpath.collector.mapping import map_calls
from tokenpath.collector.spans import SPAN_KIND_CLIENT, SPAN_KIND_SERVER, SpanData

CHAT = "/v1/chat/completions"


def _engine(tid: str, parent: str, start: float, prompt: int, completion: int,
            request_id: str) -> SpanData:
    return span(tid, A.VLLM_REQUEST_SPAN_NAME, parent=parent, kind=SPAN_KIND_SERVER,
                start=start, end=start + 0.8, attributes={
                    A.GEN_AI_REQUEST_MODEL: "m", A.GEN_AI_REQUEST_ID: request_id,
                    A.VLLM_USAGE_PROMPT_TOKENS: prompt,
                    A.VLLM_USAGE_COMPLETION_TOKENS: completion,
                    A.VLLM_LATENCY_TIME_IN_QUEUE: 0.01,
                    A.VLLM_LATENCY_TIME_IN_MODEL_PREFILL: 0.1,
                    A.VLLM_LATENCY_TIME_IN_MODEL_DECODE: 0.6})


def _llm_call(tid: str, parent: str, start: float, prompt: int, completion: int,
              index: int) -> list[SpanData]:
    client = span(tid, "chat m", parent=parent, kind=SPAN_KIND_CLIENT, start=start,
                  end=start + 1.0, attributes={A.GEN_AI_OPERATION_NAME: "chat",
                                               A.GEN_AI_REQUEST_MODEL: "m",
                                               A.GEN_AI_USAGE_INPUT_TOKENS: prompt + 1})
    gateway = span(tid, f"POST {CHAT}", parent=client.span_id, kind=SPAN_KIND_SERVER,
                   start=start + 0.05, end=start + 0.95,
                   attributes={"http.route": CHAT, A.HTTP_RESPONSE_STATUS_CODE: 200})
    return [client, gateway,
            _engine(tid, gateway.span_id, start + 0.1, prompt, completion, f"req-{index}")]


def test_an_agent_workflow_gives_a_record_per_call() -> None:
    tid = new_trace_id()
    root = span(tid, "workflow", start=0.0, end=50.0)
    tool = span(tid, "tool: search", parent=root.span_id, start=2.0, end=37.0)
    calls = [(0.5, 10, 20), (38.0, 14, 15), (45.0, 20, 25)]
    spans = [root, tool]
    for index, (start, prompt, completion) in enumerate(calls):
        spans += _llm_call(tid, root.span_id, start, prompt, completion, index)
    annotations = [{A.GEN_AI_REQUEST_ID: f"req-{i}", A.CACHED_TOKENS: i + 1} for i in range(3)]
    records = sorted(map_calls(AssembledTrace(tid, spans, True, annotations)),
                     key=lambda r: r.start_unix)
    assert len(records) == 3
    assert {r.trace_id for r in records} == {tid}
    assert len({r.record_id for r in records}) == 3
    assert all(r.record_id.startswith(f"{tid}-") for r in records)
    # each call's own tokens (the engine's, not the client's), annotation and duration
    assert [(r.input_tokens, r.output_tokens) for r in records] == [(p, c) for _, p, c in calls]
    assert [r.cache_read_tokens for r in records] == [1, 2, 3]
    assert all(r.duration_seconds < 1.5 for r in records)  # not the whole workflow


def test_retries_are_attempts_of_one_call() -> None:
    tid = new_trace_id()
    client = span(tid, "chat m", kind=SPAN_KIND_CLIENT, start=0.0, end=3.0,
                  attributes={A.GEN_AI_OPERATION_NAME: "chat", A.GEN_AI_REQUEST_MODEL: "m"})
    spans = [client]
    for attempt in range(2):  # two 503s that never reached the engine
        spans.append(span(tid, f"POST {CHAT}", parent=client.span_id, kind=SPAN_KIND_SERVER,
                          start=attempt * 0.5, end=attempt * 0.5 + 0.1,
                          attributes={"http.route": CHAT, A.HTTP_RESPONSE_STATUS_CODE: 503}))
    last = span(tid, f"POST {CHAT}", parent=client.span_id, kind=SPAN_KIND_SERVER,
                start=1.5, end=2.9, attributes={"http.route": CHAT,
                                                A.HTTP_RESPONSE_STATUS_CODE: 200})
    spans += [last, _engine(tid, last.span_id, 1.6, 30, 12, "req-r")]
    (record,) = map_calls(AssembledTrace(tid, spans, True, []))
    assert (record.input_tokens, record.output_tokens) == (30, 12)
    assert record.record_id == tid


def test_prefill_and_decode_engines_of_one_request_are_one_record() -> None:
    tid = new_trace_id()
    gateway = span(tid, f"POST {CHAT}", kind=SPAN_KIND_SERVER, start=0.0, end=2.0,
                   attributes={"http.route": CHAT})
    prefill = _engine(tid, gateway.span_id, 0.1, 500, 1, "req-p")
    decode = _engine(tid, gateway.span_id, 0.3, 500, 40, "req-d")
    (record,) = map_calls(AssembledTrace(tid, [gateway, prefill, decode], True, []))
    assert record.record_id == tid


def test_a_collector_stores_each_call_and_groups_them_by_trace(
        make_service: ServiceFactory) -> None:
    # client calls with no serving side here: each waits join.wait_seconds for one
    service = make_service(join=JoinConfig(wait_seconds=0.5))
    trace_id = new_trace_bytes()
    root = make_span(trace_id, name="workflow", duration_ns=5_000_000_000)
    spans = [root]
    for index in range(3):
        client = make_span(trace_id, parent=root.span_id, name="chat m", kind=SPAN_KIND_CLIENT,
                           attrs={A.GEN_AI_OPERATION_NAME: "chat", A.GEN_AI_REQUEST_MODEL: "m",
                                  A.GEN_AI_USAGE_INPUT_TOKENS: 10 * (index + 1),
                                  A.GEN_AI_USAGE_OUTPUT_TOKENS: index + 1})
        spans.append(client)
    response = httpx.post(f"{service.http_url}/v1/traces",
                          content=export_request(spans).SerializeToString(),
                          headers={"Content-Type": "application/x-protobuf"})
    assert response.status_code == 200
    wait_for(lambda: service.store.count() == 3)
    calls = httpx.get(f"{service.http_url}/api/traces/{trace_id.hex()}").json()
    assert sorted(c["input_tokens"] for c in calls) == [10, 20, 30]
    one = httpx.get(f"{service.http_url}/api/requests/{calls[1]['record_id']}").json()
    assert one["record_id"] == calls[1]["record_id"]
    by_trace = httpx.get(f"{service.http_url}/api/requests/{trace_id.hex()}")
    assert by_trace.status_code == 200 and by_trace.json()["trace_id"] == trace_id.hex()
    assert httpx.get(f"{service.http_url}/api/traces/{'0' * 31}1").status_code == 404


@pytest.mark.parametrize("remote_parents", [False, True])
def test_an_agent_with_a_35_s_tool_step_loses_nothing(remote_parents: bool) -> None:
    """Call 1, a 35 s tool step, calls 2 and 3, then the workflow's root: the trace goes
    idle (no root yet) past the idle timeout, is emitted with call 1 and stays open; the
    rest arrives as its continuation. Three complete records, no span late. With the
    SDK's remote-parent flags on the gateway and engine spans (local roots), the first
    call's grace hands it on as early, and the trace stays open all the same."""
    from testkit.fakes.clock import FakeClock
    from tests.collector.cost.helpers import RecordingSink
    from tokenpath.collector.assembler import Assembler, AssemblerConfig
    from tokenpath.collector.mapping import StageMapper
    from tokenpath.collector.stats import CollectorStats

    clock = FakeClock(0.0)
    stats = CollectorStats()
    sink = RecordingSink()
    assembler = Assembler(StageMapper(sink, stats), AssemblerConfig(), stats, clock=clock)
    tid = new_trace_id()
    root = span(tid, "workflow", start=0.0, end=50.0)
    tool = span(tid, "tool: search", parent=root.span_id, start=2.0, end=37.0)
    def call(start: float, prompt: int, completion: int, index: int) -> list[SpanData]:
        spans = _llm_call(tid, root.span_id, start, prompt, completion, index)
        for s in spans[1:]:  # the gateway's and the engine's parents are in other processes
            s.remote_parent = remote_parents
        return spans

    first = call(0.5, 10, 20, 0)
    assembler.consume_spans(first)
    clock.now = 31.0  # past the 30 s idle timeout, the workflow still running
    assembler.tick()
    assert [r.input_tokens for r in sink.records] == [10]
    clock.now = 38.0
    assembler.consume_spans([tool, *call(38.0, 14, 15, 1)])
    clock.now = 46.0
    assembler.consume_spans([*call(45.0, 20, 25, 2), root])
    clock.now = 46.0 + AssemblerConfig().root_grace_seconds + 0.1
    assembler.tick()
    assembler.shutdown()
    records = sorted(sink.records, key=lambda r: r.start_unix)
    assert [(r.input_tokens, r.output_tokens) for r in records] == [(10, 20), (14, 15), (20, 25)]
    assert all(r.complete for r in records)
    assert len({r.record_id for r in records}) == 3
    assert stats.spans_dropped["late"] == 0 and stats.spans_dropped["duplicate"] == 0
    # once the root was emitted the trace is finished: a straggler is late
    straggler = span(tid, "straggler", parent=root.span_id, start=49.0, end=49.5)
    assert assembler.consume_spans([straggler]) == {"late": 1}


def test_a_client_spans_first_chunk_is_the_ttft() -> None:
    tid = new_trace_id()
    client = span(tid, "chat m", kind=SPAN_KIND_CLIENT, start=0.0, end=2.0,
                  attributes={A.GEN_AI_OPERATION_NAME: "chat", A.GEN_AI_REQUEST_MODEL: "m",
                              A.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: 0.42})
    engine = _engine(tid, client.span_id, 0.1, 30, 12, "req-t")
    (record,) = map_calls(AssembledTrace(tid, [client, engine], True, []))
    assert record.ttft_seconds == 0.42  # the client's, not the engine's


def test_a_client_that_exports_elsewhere_leaves_a_local_root() -> None:
    """The gateway's server span continues a trace the client started in another process
    (OTLP span flags: parent is remote); the client exports elsewhere, so no root ever
    comes. The server span is the local root: the record is final after the root grace,
    not the idle timeout."""
    from testkit.fakes.clock import FakeClock
    from testkit.support.otlp import new_span_id
    from tests.collector.cost.helpers import RecordingSink
    from tokenpath.collector.assembler import Assembler, AssemblerConfig
    from tokenpath.collector.limits import IngestLimits
    from tokenpath.collector.mapping import StageMapper
    from tokenpath.collector.receivers.otlp_decode import decode_traces
    from tokenpath.collector.stats import CollectorStats

    trace_id = new_trace_bytes()
    server = make_span(trace_id, parent=new_span_id(), name=f"POST {CHAT}",
                       kind=SPAN_KIND_SERVER, attrs={"http.route": CHAT,
                                                     A.GEN_AI_REQUEST_MODEL: "m"})
    server.flags = 0x100 | 0x200  # the SDK's "parent is remote"
    spans = decode_traces(export_request([server]), IngestLimits()).spans
    assert spans[0].is_local_root
    clock = FakeClock(0.0)
    sink = RecordingSink()
    config = AssemblerConfig()
    assembler = Assembler(StageMapper(sink, CollectorStats()), config, clock=clock)
    assembler.consume_spans(spans)
    clock.now = config.root_grace_seconds + 0.1  # far short of the idle timeout
    assembler.tick()
    (record,) = sink.records
    assert record.complete


def test_a_stream_longer_than_the_idle_timeout_is_one_record() -> None:
    """A 50 s stream: the gateway's auth stage span is exported at once, the server and
    engine spans when the stream ends. The stage span alone holds no call: it waits one
    more idle period, and the request is one record, not two."""
    from testkit.fakes.clock import FakeClock
    from tests.collector.cost.helpers import RecordingSink
    from tokenpath.collector.assembler import Assembler, AssemblerConfig
    from tokenpath.collector.mapping import StageMapper
    from tokenpath.collector.stats import CollectorStats
    from tokenpath.stages import StageId

    clock = FakeClock(0.0)
    sink = RecordingSink()
    config = AssemblerConfig()
    assembler = Assembler(StageMapper(sink, CollectorStats()), config, clock=clock)
    tid = new_trace_id()
    gateway = span(tid, f"POST {CHAT}", kind=SPAN_KIND_SERVER, start=0.0, end=50.0,
                   attributes={"http.route": CHAT})
    auth = span(tid, "auth", parent=gateway.span_id, start=0.001, end=0.003,
                attributes={A.STAGE: StageId.AUTH_RATELIMIT.value})
    assembler.consume_spans([auth])
    clock.now = config.idle_timeout_seconds + 1.0
    assembler.tick()
    assert sink.records == []  # no call yet: it waits
    clock.now = 50.0
    assembler.consume_spans([gateway, _engine(tid, gateway.span_id, 0.1, 40, 900, "req-s")])
    clock.now = 50.0 + config.root_grace_seconds + 0.1
    assembler.tick()
    (record,) = sink.records
    assert record.output_tokens == 900 and StageId.AUTH_RATELIMIT in record.stages
