"""The documented rule for late, duplicate and out-of-order spans (collector/assembler.py
docstring), and clock skew between hosts never giving negative times."""

from __future__ import annotations

import time

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.trace.v1 import trace_pb2

from testkit.fakes.clock import FakeClock
from testkit.support.otlp import PROTOBUF_HEADERS, export_request, make_span, new_trace_id
from tests.collector.conftest import ServiceFactory, wait_for
from tokenpath import attributes as A
from tokenpath.collector.assembler import AssembledTrace, Assembler, AssemblerConfig
from tokenpath.collector.mapping import map_trace
from tokenpath.collector.spans import SPAN_KIND_CLIENT, SPAN_KIND_SERVER, SpanData, SpanEvent
from tokenpath.collector.stats import CollectorStats
from tokenpath.collector.store import RecordStore
from tokenpath.records import RequestRecord
from tokenpath.stages import StageId


class _Traces:
    def __init__(self) -> None:
        self.traces: list[AssembledTrace] = []

    def consume_trace(self, trace: AssembledTrace) -> None:
        self.traces.append(trace)

    def shutdown(self) -> None:
        pass


def _span(trace: str, span: str, parent: str = "", start_s: float = 0.0,
          seconds: float = 0.01) -> SpanData:
    start = int((1_700_000_000 + start_s) * 1e9)
    return SpanData(trace, span, parent, "s", 1, start, start + int(seconds * 1e9),
                    {A.STAGE: StageId.ROUTER.value})


TRACE = "0" * 31 + "1"


def _assembler(**cfg: float) -> tuple[Assembler, _Traces, FakeClock, CollectorStats]:
    clock, out, stats = FakeClock(1000.0), _Traces(), CollectorStats()
    config = AssemblerConfig(root_grace_seconds=cfg.get("grace", 1.0),
                             idle_timeout_seconds=cfg.get("idle", 30.0))
    return Assembler(out, config, stats, clock), out, clock, stats


def test_out_of_order_spans_join_one_trace() -> None:
    assembler, out, clock, _ = _assembler()
    # Children first, in separate batches, with start times out of order; root last.
    assembler.consume_spans([_span(TRACE, "c2", "root", start_s=0.5)])
    clock.now += 0.5
    assembler.consume_spans([_span(TRACE, "c1", "root", start_s=0.1)])
    clock.now += 0.5
    assembler.consume_spans([_span(TRACE, "root", start_s=0.0, seconds=1.0)])
    assert assembler.tick() == 0  # the root's grace period has not passed
    clock.now += 1.0
    assert assembler.tick() == 1
    (trace,) = out.traces
    assert trace.complete and sorted(s.span_id for s in trace.spans) == ["c1", "c2", "root"]


def test_duplicate_span_counts_once() -> None:
    assembler, out, clock, stats = _assembler()
    root = _span(TRACE, "root")
    assert assembler.consume_spans([root, _span(TRACE, "c", "root")]) == {}
    assert assembler.consume_spans([root, _span(TRACE, "c", "root")]) == {}  # a retried batch
    clock.now += 2
    assembler.tick()
    assert len(out.traces[0].spans) == 2
    assert stats.spans_dropped["duplicate"] == 2


def test_late_span_is_dropped_and_counted_not_a_second_record() -> None:
    assembler, out, clock, stats = _assembler()
    assembler.consume_spans([_span(TRACE, "root")])
    clock.now += 2
    assembler.tick()
    refused = assembler.consume_spans([_span(TRACE, "late-child", "root")])
    clock.now += 60
    assembler.tick()
    assert refused == {"late": 1}
    assert len(out.traces) == 1
    assert stats.spans_dropped["late"] == 1


def test_trace_without_root_is_final_after_idle_timeout_as_incomplete() -> None:
    assembler, out, clock, _ = _assembler(idle=5.0)
    assembler.consume_spans([_span(TRACE, "c", "missing-root")])
    clock.now += 4.9
    assert assembler.tick() == 0
    clock.now += 0.2
    assert assembler.tick() == 0  # no LLM call span in it yet: a second idle period
    clock.now += 5.0
    assert assembler.tick() == 1
    assert out.traces[0].complete is False


def _hop(span: str, parent: str = "", remote: bool = False, kind: int = SPAN_KIND_SERVER,
         attributes: dict[str, str] | None = None) -> SpanData:
    start = int(1_700_000_000 * 1e9)
    return SpanData(TRACE, span, parent, span, kind, start, start + 10**9,
                    dict(attributes or {}), remote_parent=remote)


def test_a_span_above_a_call_handed_on_is_late_not_a_second_call() -> None:
    """An engine's server span (a local root: its parent, the gateway's, is in another
    process) is handed on at its grace; the gateway's span exported after that belongs to
    the call already recorded: late, never a new call. A later call under the same
    gateway is recorded in its turn, and the GenAI client's span above the gateway goes
    on as the call's outer hop (the call joiner's to join)."""
    assembler, out, clock, stats = _assembler(grace=1.0)
    assembler.consume_spans([_hop("engine-1", parent="gateway", remote=True)])
    clock.now += 1.5
    assert assembler.tick() == 1
    gateway = _hop("gateway", parent="client", remote=True,
                   attributes={A.HTTP_ROUTE: "/v1/chat/completions"})
    refused = assembler.consume_spans([gateway])
    assert refused == {"late": 1} and stats.spans_dropped["late"] == 1
    assembler.consume_spans([_hop("engine-2", parent="gateway", remote=True)])
    clock.now += 1.5
    assert assembler.tick() == 1
    client = _hop("client", kind=SPAN_KIND_CLIENT,
                  attributes={A.GEN_AI_OPERATION_NAME: "chat"})
    assert assembler.consume_spans([client]) == {}
    clock.now += 1.5
    assert assembler.tick() == 1
    assert [[s.span_id for s in t.spans] for t in out.traces] == [
        ["engine-1"], ["engine-2"], ["client"]]
    assert [t.continued for t in out.traces] == [False, True, True]
    assert assembler.consume_spans([_hop("late", parent="client")]) == {"late": 1}


def test_a_root_call_span_above_a_call_handed_on_finishes_the_trace() -> None:
    """The gateway's span is the trace's root: late like any call span above, and the
    trace is finished, so a straggler after it is late as well."""
    assembler, out, clock, stats = _assembler(grace=1.0)
    assembler.consume_spans([_hop("engine", parent="gateway", remote=True)])
    clock.now += 1.5
    assert assembler.tick() == 1
    gateway = _hop("gateway", attributes={A.HTTP_ROUTE: "/v1/chat/completions"})
    assert assembler.consume_spans([gateway]) == {"late": 1}
    assert assembler.consume_spans([_hop("straggler", parent="engine")]) == {"late": 1}
    clock.now += 60.0
    assembler.tick()
    assert len(out.traces) == 1 and stats.spans_dropped["late"] == 2


def test_a_gateway_span_after_its_engine_part_is_one_record(
        make_service: ServiceFactory) -> None:
    """End to end over OTLP/HTTP: vLLM's span (remote parent) recorded at its grace, then
    the gateway's server span over it: still one request, the gateway's span late."""
    service = make_service()
    trace_id = new_trace_id()
    gateway = make_span(trace_id, name="POST /v1/chat/completions", kind=SPAN_KIND_SERVER,
                        attrs={"http.request.method": "POST",
                               "http.route": "/v1/chat/completions"}, duration_ns=10**9)
    engine = make_span(trace_id, parent=gateway.span_id, name=A.VLLM_REQUEST_SPAN_NAME,
                       kind=SPAN_KIND_SERVER, start_ns=gateway.start_time_unix_nano + 10**6,
                       duration_ns=9 * 10**8,
                       attrs={A.GEN_AI_REQUEST_MODEL: "m", A.GEN_AI_USAGE_INPUT_TOKENS: 100,
                              A.GEN_AI_USAGE_OUTPUT_TOKENS: 20,
                              A.VLLM_LATENCY_TIME_IN_QUEUE: 0.01,
                              A.VLLM_LATENCY_TIME_IN_MODEL_PREFILL: 0.1,
                              A.VLLM_LATENCY_TIME_IN_MODEL_DECODE: 0.7})
    engine.flags = (trace_pb2.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
                    | trace_pb2.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK)
    url = f"{service.http_url}/v1/traces"
    for span in (engine, gateway):
        httpx.post(url, content=export_request([span]).SerializeToString(),
                   headers=PROTOBUF_HEADERS, timeout=5).raise_for_status()
        wait_for(lambda: service.store.count() >= 1)
    # the gateway's span was taken: dropped as late, or (wrongly) a record of its own
    wait_for(lambda: service.stats.spans_dropped.get("late") == 1
             or service.store.count() == 2)
    assert service.store.count() == 1
    record = service.store.record(trace_id.hex())
    assert record is not None and record.model == "m"


def test_store_never_holds_duplicate_records(make_service: ServiceFactory) -> None:
    """A trace id finalized twice (e.g. after the finished-trace memory forgot it) keeps
    the first record; the store has one row per trace id."""
    store = RecordStore()
    record = RequestRecord(trace_id=TRACE, complete=True, model="first")
    store.consume_record(record)
    store.consume_record(RequestRecord(trace_id=TRACE, complete=False, model="second"))
    assert store.count() == 1
    got = store.record(TRACE)
    assert got is not None and got.model == "first"
    store.shutdown()
    # End to end: the same export delivered three times (client retries) is one record.
    service = make_service()
    trace_id = new_trace_id()
    root = make_span(trace_id, name="request", attrs={A.STAGE: StageId.ROUTER.value})
    child = make_span(trace_id, parent=root.span_id, attrs={A.STAGE: StageId.AUTH_RATELIMIT.value})
    body = export_request([child, root]).SerializeToString()
    for _ in range(3):
        httpx.post(f"{service.http_url}/v1/traces", content=body, headers=PROTOBUF_HEADERS,
                   timeout=5).raise_for_status()
    wait_for(lambda: service.store.count() == 1)
    httpx.post(f"{service.http_url}/v1/traces", content=body, headers=PROTOBUF_HEADERS,
               timeout=5).raise_for_status()
    assert service.store.count() == 1
    assert service.stats.records_stored.value == 1


# --- clock skew ------------------------------------------------------------------------


def _skewed_trace(gateway_skew: float, engine_skew: float, engine_seconds: float,
                  event_seconds: float) -> AssembledTrace:
    """A gateway host and an engine host whose clocks disagree by seconds or hours."""
    base = 1_700_000_000.0
    trace = "ab" * 16

    def at(seconds: float) -> int:
        return max(0, int(seconds * 1e9))

    gateway = SpanData(trace, "g" * 16, "", "POST /v1/completions", SPAN_KIND_SERVER,
                       at(base + gateway_skew), at(base + gateway_skew + 1.0),
                       {"http.route": "/v1/completions", A.GEN_AI_REQUEST_MODEL: "m",
                        A.GEN_AI_USAGE_OUTPUT_TOKENS: 20, A.TTFT_SECONDS: 0.2})
    engine_start = base + engine_skew
    engine = SpanData(trace, "e" * 16, "g" * 16, A.VLLM_REQUEST_SPAN_NAME, 1,
                      at(engine_start), at(engine_start + engine_seconds),
                      {A.VLLM_LATENCY_TIME_IN_QUEUE: 0.05,
                       A.VLLM_LATENCY_TIME_IN_MODEL_PREFILL: 0.1,
                       A.VLLM_LATENCY_TIME_IN_MODEL_DECODE: 0.6},
                      events=[SpanEvent(A.STAGE_EVENT, at(engine_start),
                                        {A.STAGE: StageId.KV_CACHE_LOOKUP.value,
                                         A.STAGE_SECONDS: event_seconds})])
    # A span whose end was stamped by another host's clock, before its start.
    backwards = SpanData(trace, "b" * 16, "g" * 16, "detokenize", 1, at(base + 5.0),
                         at(base + 4.0), {A.STAGE: StageId.RESPONSE_PATH.value})
    return AssembledTrace(trace, [engine, backwards, gateway], complete=True)


def _assert_no_negative_times(record: RequestRecord) -> None:
    for timing in record.stages.values():
        assert timing.seconds >= 0, timing
        for share in timing.phases.values():
            assert share.seconds >= 0, timing
    for value in (record.duration_seconds, record.ttft_seconds, record.tpot_seconds,
                  record.queue_seconds, record.prefill_seconds, record.decode_seconds):
        assert value is None or value >= 0
    assert record.prefill_start_unix is not None and record.decode_start_unix is not None
    assert record.engine_end_unix is not None
    assert record.prefill_start_unix <= record.decode_start_unix <= record.engine_end_unix


@settings(max_examples=100, deadline=None)
@given(gateway_skew=st.floats(-7200, 7200), engine_skew=st.floats(-7200, 7200),
       engine_seconds=st.floats(0, 10), event_seconds=st.floats(-100, 100))
def test_clock_skew_never_yields_negative_stage_times(
        gateway_skew: float, engine_skew: float, engine_seconds: float,
        event_seconds: float) -> None:
    record = map_trace(_skewed_trace(gateway_skew, engine_skew, engine_seconds, event_seconds))
    assert record is not None
    _assert_no_negative_times(record)
    assert record.stages[StageId.RESPONSE_PATH].seconds == 0.0


def test_clock_skew_end_to_end(make_service: ServiceFactory) -> None:
    """Engine host 90 s behind the gateway host, through the receivers and the store."""
    service = make_service()
    trace_id = new_trace_id()
    now = time.time_ns()  # a fixed old date would fall to the store's retention
    gateway = make_span(trace_id, name="POST /v1/chat", kind=SPAN_KIND_SERVER, start_ns=now,
                        duration_ns=500_000_000,
                        attrs={"http.route": "/v1/chat", A.GEN_AI_REQUEST_MODEL: "m"})
    engine = make_span(trace_id, parent=gateway.span_id, name=A.VLLM_REQUEST_SPAN_NAME,
                       start_ns=now - 90 * 10**9, duration_ns=900_000_000,  # longer than gateway
                       attrs={A.VLLM_LATENCY_TIME_IN_MODEL_PREFILL: 0.3,
                              A.VLLM_LATENCY_TIME_IN_MODEL_DECODE: 0.5})
    backwards = make_span(trace_id, parent=gateway.span_id, start_ns=now,
                          attrs={A.STAGE: StageId.AUTH_RATELIMIT.value})
    backwards.end_time_unix_nano = now - 10**9
    httpx.post(f"{service.http_url}/v1/traces",
               content=export_request([engine, backwards, gateway]).SerializeToString(),
               headers=PROTOBUF_HEADERS, timeout=5).raise_for_status()
    wait_for(lambda: service.store.record(trace_id.hex()) is not None)
    record = service.store.record(trace_id.hex())
    assert record is not None
    _assert_no_negative_times(record)
    assert record.stages[StageId.API_GATEWAY].seconds == 0.0  # clamped, not -0.4
    assert record.stages[StageId.AUTH_RATELIMIT].seconds == 0.0
