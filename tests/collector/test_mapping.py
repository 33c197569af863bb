"""How spans become stages (collector/mapping.py rules)."""

from __future__ import annotations

import pytest

from testkit.fakes.spans import new_trace_id, span
from tokenpath import attributes as A
from tokenpath.collector.assembler import AssembledTrace
from tokenpath.collector.mapping import MAX_COUNT, map_trace
from tokenpath.collector.spans import SPAN_KIND_SERVER, SpanEvent
from tokenpath.stages import Phase, Provenance, StageId

VLLM_ATTRS = {
    A.GEN_AI_REQUEST_MODEL: "tiny-llama",
    A.GEN_AI_REQUEST_ID: "cmpl-1",
    A.VLLM_USAGE_PROMPT_TOKENS: 120,
    A.VLLM_USAGE_COMPLETION_TOKENS: 11,
    A.VLLM_LATENCY_TIME_IN_QUEUE: 0.004,
    A.VLLM_LATENCY_TIME_TO_FIRST_TOKEN: 0.05,
    A.VLLM_LATENCY_TIME_IN_MODEL_PREFILL: 0.03,
    A.VLLM_LATENCY_TIME_IN_MODEL_DECODE: 0.2,
    A.VLLM_LATENCY_E2E: 0.26,
}


def trace(*spans: object, complete: bool = True, annotations: list[dict] | None = None
          ) -> AssembledTrace:
    items = list(spans)
    return AssembledTrace(items[0].trace_id, items, complete, annotations or [])  # type: ignore[attr-defined]


def test_vllm_llm_request_span_alone_is_a_request() -> None:
    tid = new_trace_id()
    record = map_trace(trace(span(tid, A.VLLM_REQUEST_SPAN_NAME, kind=SPAN_KIND_SERVER,
                                  start=100.0, end=100.26, attributes=VLLM_ATTRS)))
    assert record is not None
    assert record.model == "tiny-llama"
    assert (record.input_tokens, record.output_tokens) == (120, 11)
    assert record.ttft_seconds == pytest.approx(0.05)
    assert record.stages[StageId.SCHEDULER_QUEUE].seconds == pytest.approx(0.004)
    assert record.prefill_seconds == pytest.approx(0.03)
    assert record.decode_seconds == pytest.approx(0.2)
    assert record.tpot_seconds == pytest.approx(0.2 / 10)
    assert record.engine_end_unix == pytest.approx(100.26)
    assert record.decode_start_unix == pytest.approx(100.06)
    assert record.prefill_start_unix == pytest.approx(100.03)
    # GPU stages split in-model time and never add any.
    kernel, hbm = record.stages[StageId.KERNEL_EXEC], record.stages[StageId.HBM_LOAD]
    assert kernel.provenance is Provenance.MODELED and hbm.provenance is Provenance.MODELED
    assert kernel.seconds + hbm.seconds == pytest.approx(0.23)
    assert kernel.phases[Phase.PREFILL].seconds == pytest.approx(0.03)


def test_gpu_dispatch_measured_is_taken_out_of_in_model_time() -> None:
    tid = new_trace_id()
    events = [SpanEvent(A.STAGE_EVENT, 0, {A.STAGE: StageId.GPU_DISPATCH.value,
                                           A.STAGE_SECONDS: 0.01, A.PHASE: "decode"})]
    record = map_trace(trace(span(tid, A.VLLM_REQUEST_SPAN_NAME, attributes=VLLM_ATTRS,
                                  events=events)))
    assert record is not None
    gpu = sum(record.stages[s].seconds for s in (StageId.GPU_DISPATCH, StageId.HBM_LOAD,
                                                 StageId.KERNEL_EXEC))
    assert gpu == pytest.approx(0.23)
    assert record.stages[StageId.HBM_LOAD].seconds == pytest.approx(0.19)


def test_plain_asgi_server_span_is_the_gateway_less_the_engine() -> None:
    tid = new_trace_id()
    server = span(tid, "POST /v1/completions", kind=SPAN_KIND_SERVER, start=10.0, end=10.5,
                  attributes={"http.route": "/v1/completions", "http.method": "POST"})
    engine = span(tid, A.VLLM_REQUEST_SPAN_NAME, parent=server.span_id, start=10.1, end=10.4,
                  attributes=VLLM_ATTRS)
    record = map_trace(trace(engine, server))
    assert record is not None
    gateway = record.stages[StageId.API_GATEWAY]
    assert gateway.seconds == pytest.approx(0.2)
    assert gateway.provenance is Provenance.DERIVED
    assert record.trace_id == tid


def test_startup_spans_are_not_requests() -> None:
    for name in ("Executor init", "Worker init", "Load model"):
        assert map_trace(trace(span(new_trace_id(), name))) is None


def test_clock_skew_never_gives_negative_stage_times() -> None:
    tid = new_trace_id()
    # The engine host's clock runs ahead: its span "starts" after the gateway span ends.
    server = span(tid, "GET /", kind=SPAN_KIND_SERVER, start=10.0, end=10.1,
                  attributes={"http.route": "/"})
    engine = span(tid, A.VLLM_REQUEST_SPAN_NAME, parent=server.span_id, start=12.0, end=12.5,
                  attributes={**VLLM_ATTRS, A.VLLM_LATENCY_TIME_IN_QUEUE: -0.3})
    bad_event = SpanEvent(A.STAGE_EVENT, 0, {A.STAGE: StageId.ROUTER.value,
                                             A.STAGE_SECONDS: -1.0})
    server.events.append(bad_event)
    record = map_trace(trace(server, engine))
    assert record is not None
    assert all(t.seconds >= 0 for t in record.stages.values())
    assert record.stages[StageId.API_GATEWAY].seconds == 0.0
    assert record.duration_seconds >= 0


def test_annotations_fill_cached_tokens() -> None:
    tid = new_trace_id()
    record = map_trace(trace(span(tid, A.VLLM_REQUEST_SPAN_NAME, attributes=VLLM_ATTRS),
                             annotations=[{A.GEN_AI_REQUEST_ID: "cmpl-1", A.CACHED_TOKENS: 96}]))
    assert record is not None
    assert record.cache_read_tokens == 96


def test_stage_spans_and_events_add_up_per_phase() -> None:
    tid = new_trace_id()
    root = span(tid, "root", start=0.0, end=1.0, events=[
        SpanEvent(A.STAGE_EVENT, 0, {A.STAGE: StageId.GPU_DISPATCH.value, A.STAGE_SECONDS: 0.002,
                                     A.PHASE: "prefill"}),
        SpanEvent(A.STAGE_EVENT, 0, {A.STAGE: StageId.GPU_DISPATCH.value, A.STAGE_SECONDS: 0.003,
                                     A.PHASE: "decode"}),
        SpanEvent(A.STAGE_EVENT, 0, {A.STAGE: "not_a_stage", A.STAGE_SECONDS: 1.0}),
    ])
    child = span(tid, "nic", parent=root.span_id, start=0.5, end=0.75,
                 attributes={A.STAGE: StageId.NIC_TX.value, A.PROVENANCE: "derived"})
    record = map_trace(trace(root, child))
    assert record is not None
    dispatch = record.stages[StageId.GPU_DISPATCH]
    assert dispatch.seconds == pytest.approx(0.005)
    assert dispatch.phases[Phase.PREFILL].seconds == pytest.approx(0.002)
    assert record.stages[StageId.NIC_TX].provenance is Provenance.DERIVED
    assert record.stages[StageId.NIC_TX].seconds == pytest.approx(0.25)
    assert set(record.stages) == {StageId.GPU_DISPATCH, StageId.NIC_TX}


@pytest.mark.parametrize(("seconds", "expected"), [
    (0.25, 0.25),  # the common case: a positive finite double
    (2, 2.0),  # an integer
    ("0.5", 0.5),  # a number sent as text
    (0.0, 0.0),
    (-1.5, 0.0),  # skew: a negative duration counts as none
    (-0.0, 0.0),
    (True, None),  # not a number: the event is skipped
    ("soon", None),
    (float("nan"), None),
    (float("inf"), None),
])
def test_a_stage_events_seconds_are_read_as_any_duration(seconds: object,
                                                         expected: float | None) -> None:
    tid = new_trace_id()
    root = span(tid, "root", start=0.0, end=1.0, events=[
        SpanEvent(A.STAGE_EVENT, 0, {A.STAGE: StageId.ROUTER.value, A.STAGE_SECONDS: seconds,
                                     A.PROVENANCE: "derived", A.PHASE: "decode"}),
        SpanEvent(A.STAGE_EVENT, 0, {A.STAGE: StageId.NIC_TX.value, A.STAGE_SECONDS: 0.1,
                                     A.PROVENANCE: 4, A.PHASE: ("decode",)}),
    ])
    record = map_trace(trace(root))
    assert record is not None
    nic = record.stages[StageId.NIC_TX]  # a provenance or phase not a string: the defaults
    assert (nic.seconds, nic.provenance, nic.phases) == (0.1, Provenance.MEASURED, {})
    if expected is None:
        assert StageId.ROUTER not in record.stages
        return
    router = record.stages[StageId.ROUTER]
    assert repr(router.seconds) == repr(expected)  # 0.0, never -0.0
    assert router.provenance is Provenance.DERIVED
    assert repr(router.phases[Phase.DECODE].seconds) == repr(expected)


def test_a_garbled_token_count_is_capped_at_64_bits() -> None:
    tid = new_trace_id()
    attributes = {**VLLM_ATTRS, A.VLLM_USAGE_PROMPT_TOKENS: 1e300,
                  A.VLLM_USAGE_COMPLETION_TOKENS: "1e30"}
    record = map_trace(trace(span(tid, A.VLLM_REQUEST_SPAN_NAME, kind=SPAN_KIND_SERVER,
                                  start=100.0, end=100.26, attributes=attributes)))
    assert record is not None
    assert record.input_tokens == MAX_COUNT
    assert record.output_tokens == MAX_COUNT


def test_a_stage_span_whose_stage_phase_or_provenance_is_not_a_string_is_read_safely() -> None:
    tid = new_trace_id()
    root = span(tid, "root", start=0.0, end=1.0,
                attributes={A.STAGE: StageId.ROUTER.value, A.PROVENANCE: 3,
                            A.PHASE: ("prefill",)})
    numbered = span(tid, "numbered", parent=root.span_id, start=0.1, end=0.2,
                    attributes={A.STAGE: 7})
    listed = span(tid, "listed", parent=root.span_id, start=0.1, end=0.2,
                  attributes={A.STAGE: (StageId.NIC_TX.value,)})
    record = map_trace(trace(root, numbered, listed))
    assert record is not None
    router = record.stages[StageId.ROUTER]
    assert router.provenance is Provenance.MEASURED  # the default, not a crash
    assert router.phases == {}
    assert set(record.stages) == {StageId.ROUTER}


def test_request_facts_come_from_annotations_then_engine_then_root_then_other_spans() -> None:
    tid = new_trace_id()
    root = span(tid, "root", start=0.0, end=1.0,
                attributes={A.NODE: "root-node", A.POOL: "root-pool",
                            A.GEN_AI_REQUEST_MODEL: "root-model"})
    engine = span(tid, A.VLLM_REQUEST_SPAN_NAME, parent=root.span_id, start=0.1, end=0.9,
                  attributes={**VLLM_ATTRS, A.NODE: "engine-node"})
    stage = span(tid, "stage", parent=root.span_id, start=0.2, end=0.3,
                 attributes={A.STAGE: StageId.ROUTER.value, A.GPU_TYPE: "h100",
                             A.NODE: "stage-node"})
    record = map_trace(trace(stage, root, engine,
                             annotations=[{A.GEN_AI_REQUEST_ID: "cmpl-1", A.POOL: "noted"}]))
    assert record is not None
    assert record.pool == "noted"  # an annotation wins over every span
    assert record.node == "engine-node"  # the engine span wins over the root
    assert record.model == "tiny-llama"  # so does its model
    assert record.gpu_type == "h100"  # found on a plain span when nothing else has it


def test_fingerprints_keep_the_block_size_they_were_taken_with() -> None:
    tid = new_trace_id()
    attributes = {**VLLM_ATTRS, A.PREFIX_FINGERPRINTS: ("a", "b"), A.PREFIX_BLOCK_TOKENS: 64}
    record = map_trace(trace(span(tid, A.VLLM_REQUEST_SPAN_NAME, attributes=attributes)))
    assert record is not None
    assert (record.prefix_fingerprints, record.prefix_block_tokens) == (("a", "b"), 64)
    assert record.to_json()["prefix_block_tokens"] == 64


def test_an_engine_span_without_a_queue_time_records_no_queue_stage() -> None:
    tid = new_trace_id()
    attributes = {k: v for k, v in VLLM_ATTRS.items() if k != A.VLLM_LATENCY_TIME_IN_QUEUE}
    record = map_trace(trace(span(tid, A.VLLM_REQUEST_SPAN_NAME, attributes=attributes)))
    assert record is not None
    assert record.queue_seconds is None  # not recorded, never a measured 0 s
    assert StageId.SCHEDULER_QUEUE not in record.stages
    assert record.prefill_seconds == pytest.approx(0.03)


def test_health_checks_docs_and_404s_are_not_requests() -> None:
    from tokenpath.collector.mapping import StageMapper
    from tokenpath.collector.stats import CollectorStats

    class Keep:
        records: list = []

        def consume_record(self, record):  # type: ignore[no-untyped-def]
            self.records.append(record)

        def shutdown(self) -> None:
            pass

    stats = CollectorStats()
    keep = Keep()
    mapper = StageMapper(keep, stats)
    for route, status in (("/healthz", 200), ("/docs", 200), ("/nope", 404)):
        tid = new_trace_id()
        mapper.consume_trace(trace(span(tid, f"GET {route}", kind=SPAN_KIND_SERVER,
                                        attributes={"http.route": route,
                                                    "http.response.status_code": status})))
    assert keep.records == []
    assert stats.http_calls_not_llm == {"other_route": 2, "4xx": 1}
    # an LLM route is a request, and a gen_ai attribute makes one of any route
    for route, attributes in (("/v1/chat/completions", {}),
                              ("/api/ask", {A.GEN_AI_REQUEST_MODEL: "m"})):
        tid = new_trace_id()
        mapper.consume_trace(trace(span(tid, "POST", kind=SPAN_KIND_SERVER,
                                        attributes={"http.route": route, **attributes})))
    assert len(keep.records) == 2


def test_status_follows_the_http_status_code() -> None:
    for code, status in ((200, "ok"), (429, "client_error"), (503, "error")):
        tid = new_trace_id()
        record = map_trace(trace(span(tid, "POST", kind=SPAN_KIND_SERVER, attributes={
            "http.route": "/v1/completions", "http.response.status_code": code})))
        assert record is not None and record.status == status


def test_engine_tokens_win_over_a_clients_whatever_the_key() -> None:
    tid = new_trace_id()
    client = span(tid, "chat m", start=0.0, end=1.0,
                  attributes={A.GEN_AI_USAGE_INPUT_TOKENS: 7, A.GEN_AI_USAGE_OUTPUT_TOKENS: 3})
    engine = span(tid, A.VLLM_REQUEST_SPAN_NAME, parent=client.span_id, start=0.1, end=0.9,
                  attributes=VLLM_ATTRS)
    record = map_trace(trace(client, engine))
    assert record is not None
    assert record.input_tokens == VLLM_ATTRS[A.VLLM_USAGE_PROMPT_TOKENS]
    assert record.output_tokens == VLLM_ATTRS[A.VLLM_USAGE_COMPLETION_TOKENS]


def test_cached_tokens_in_every_spelling() -> None:
    for key in (A.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, A.GEN_AI_USAGE_CACHED_TOKENS,
                A.OPENINFERENCE_CACHE_READ_TOKENS, A.CACHED_TOKENS):
        tid = new_trace_id()
        record = map_trace(trace(span(tid, A.VLLM_REQUEST_SPAN_NAME,
                                      attributes={**VLLM_ATTRS, key: 40})))
        assert record is not None and record.cache_read_tokens == 40, key


def test_a_mapped_record_is_classified_by_its_spans_attributes() -> None:
    from tokenpath.slo import OUTCOME_MET, OUTCOME_MISSED, STAGE_PREFILL, SloClass, SloConfig

    classes = SloConfig((
        SloClass("priority", ttft_seconds=0.04, objective=0.999,
                 attributes=(("app.priority", "high"),)),
        SloClass("rest", ttft_seconds=1.0, tpot_seconds=0.05, objective=0.9),
    ))
    tid = new_trace_id()
    root = span(tid, "POST /v1/chat/completions", kind=SPAN_KIND_SERVER, start=100.0,
                end=100.3, attributes={"app.priority": "high"})
    engine = span(tid, A.VLLM_REQUEST_SPAN_NAME, parent=root.span_id, start=100.01,
                  end=100.27, attributes=VLLM_ATTRS)
    record = map_trace(trace(root, engine), classes)
    assert record is not None
    # TTFT 0.05 s against 0.04 s; prefill (0.03 s) is the largest part of it
    assert (record.slo, record.slo_outcome, record.slo_miss_stage) == (
        "priority", OUTCOME_MISSED, STAGE_PREFILL)
    plain = map_trace(trace(span(tid, A.VLLM_REQUEST_SPAN_NAME, attributes=VLLM_ATTRS)),
                      classes)
    assert plain is not None
    assert (plain.slo, plain.slo_outcome, plain.slo_miss_stage) == ("rest", OUTCOME_MET, None)
    unclassified = map_trace(trace(span(tid, A.VLLM_REQUEST_SPAN_NAME, attributes=VLLM_ATTRS)))
    assert unclassified is not None and unclassified.slo is None
