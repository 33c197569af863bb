"""The reference serving path end to end on loopback, with the real OTel SDK."""

from __future__ import annotations

from collections import defaultdict

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

from testkit.fakes.otel_sink import SpanSink, all_attribute_values, stage_entries
from tests.instrumentation.reference.support import fast_config, send, serving, workload_requests
from tokenpath import attributes as attr
from tokenpath.instrumentation.reference import SIMULATED_ENGINE_NAME
from tokenpath.instrumentation.reference.ground_truth import GroundTruthWriter, read_ground_truth
from tokenpath.stages import GPU_STAGES, STAGE_IDS, Phase, Provenance, StageId

# What the engine leaves to the collector: the split of its measured in-model time.
IN_MODEL_SPLIT = {StageId.HBM_LOAD, StageId.KERNEL_EXEC, StageId.NVLINK}
DERIVED = {StageId.SWITCH_HOP, StageId.NIC_TX, StageId.ETHERNET_SERIALIZE}


def _roles(spans: list[ReadableSpan]) -> tuple[ReadableSpan, ReadableSpan, ReadableSpan]:
    client = next(s for s in spans if s.name == attr.SPAN_REQUEST)
    gateway = next(s for s in spans if s.kind is SpanKind.SERVER
                   and s.name != attr.VLLM_REQUEST_SPAN_NAME)
    engine = next(s for s in spans if s.name == attr.VLLM_REQUEST_SPAN_NAME)
    return client, gateway, engine


def _event_time(span: ReadableSpan, stage: StageId, phase: Phase | None = None) -> int:
    for event in span.events:
        a = event.attributes or {}
        if a.get(attr.STAGE) == stage.value and (phase is None or a.get(attr.PHASE) == phase):
            return event.timestamp
    raise AssertionError(f"no {stage} event on {span.name}")


MIXED = [
    {"messages": [{"role": "system", "content": "be brief " * 40},
                  {"role": "user", "content": f"question {i}"}],
     "max_tokens": 5, "stream": i % 2 == 0}
    for i in range(4)
] + [{"prompt": "complete this sentence " * 10, "max_tokens": 4, "stream": s}
     for s in (True, False)]


def test_every_request_covers_all_15_stages_in_path_order() -> None:
    sink = SpanSink()
    with serving(sink.provider) as path:
        results = send(path, sink.provider, MIXED)
    assert [r.status_code for r in results] == [200] * len(MIXED)
    traces = sink.by_trace()
    assert set(traces) == {r.trace_id for r in results}
    for spans in traces.values():
        client, gateway, engine = _roles(spans)
        # one trace: client root -> gateway -> engine
        assert client.parent is None
        assert gateway.parent is not None and gateway.parent.span_id == client.context.span_id
        assert engine.parent is not None and engine.parent.span_id == gateway.context.span_id
        recorded = {stage for stage, _, _ in stage_entries(spans)}
        assert recorded == set(STAGE_IDS) - IN_MODEL_SPLIT
        engine_attrs = engine.attributes or {}
        in_model = (engine_attrs[attr.VLLM_LATENCY_TIME_IN_MODEL_PREFILL]
                    + engine_attrs[attr.VLLM_LATENCY_TIME_IN_MODEL_DECODE])
        assert in_model > 0  # the collector splits it into stages 8-10
        assert set(STAGE_IDS) == recorded | IN_MODEL_SPLIT
        provenance = {stage: a.get(attr.PROVENANCE, Provenance.MEASURED.value)
                      for stage, _, a in stage_entries(spans)}
        assert {s for s, p in provenance.items() if p == Provenance.DERIVED.value} == DERIVED
        # chronology along the path
        assert client.start_time <= gateway.start_time <= engine.start_time
        # the gateway span may end after the client got its last byte (server teardown)
        assert engine.end_time <= gateway.end_time
        chain = [
            _event_time(client, StageId.CLIENT_TOKENIZE),
            _event_time(gateway, StageId.AUTH_RATELIMIT),
            _event_time(gateway, StageId.ROUTER),
            _event_time(gateway, StageId.API_GATEWAY),  # ends at the hand-off to the engine
            _event_time(engine, StageId.SCHEDULER_QUEUE),
            _event_time(engine, StageId.GPU_DISPATCH, Phase.PREFILL),
            _event_time(gateway, StageId.RESPONSE_PATH),  # ends as the last write starts
            _event_time(client, StageId.CLIENT_DECODE),
        ]
        assert chain == sorted(chain)


def test_prefill_and_decode_are_separated() -> None:
    sink = SpanSink()
    with serving(sink.provider) as path:
        send(path, sink.provider, MIXED[:2])
    for spans in sink.by_trace().values():
        _, _, engine = _roles(spans)
        a = engine.attributes or {}
        prefill = a[attr.VLLM_LATENCY_TIME_IN_MODEL_PREFILL]
        decode = a[attr.VLLM_LATENCY_TIME_IN_MODEL_DECODE]
        assert prefill > 0 and decode > 0
        assert a[attr.VLLM_LATENCY_TIME_TO_FIRST_TOKEN] == pytest.approx(
            a[attr.VLLM_LATENCY_TIME_IN_QUEUE] + prefill, abs=1e-6)
        phases = {e.attributes.get(attr.PHASE) for e in engine.events
                  if (e.attributes or {}).get(attr.STAGE) == StageId.GPU_DISPATCH.value}
        assert phases == {Phase.PREFILL.value, Phase.DECODE.value}
        # only what the engine measures itself is recorded explicitly
        explicit = {(e.attributes or {}).get(attr.STAGE) for e in engine.events}
        assert explicit.isdisjoint({s.value for s in GPU_STAGES[1:]})


def test_engine_span_is_vllm_compatible_and_labelled_simulated() -> None:
    sink = SpanSink()
    with serving(sink.provider) as path:
        send(path, sink.provider, MIXED[:1])
    (spans,) = sink.by_trace().values()
    _, _, engine = _roles(spans)
    a = engine.attributes or {}
    assert a[attr.SIMULATED] is True and a[attr.ENGINE] == SIMULATED_ENGINE_NAME
    for key in (attr.GEN_AI_REQUEST_ID, attr.VLLM_USAGE_PROMPT_TOKENS,
                attr.VLLM_USAGE_COMPLETION_TOKENS, attr.VLLM_LATENCY_TIME_IN_QUEUE,
                attr.VLLM_LATENCY_E2E, attr.NODE, attr.POOL, attr.GPU_TYPE,
                attr.TENSOR_PARALLEL, attr.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
                attr.PREFIX_FINGERPRINTS):
        assert key in a, key
    assert a[attr.VLLM_USAGE_COMPLETION_TOKENS] == 5


def test_prompt_text_appears_in_no_span_attribute() -> None:
    sink = SpanSink()
    marker = "zebracrossingsecret"
    requests = [{"messages": [{"role": "system", "content": f"{marker} rules " * 30},
                              {"role": "user", "content": f"tell me about {marker}"}],
                 "max_tokens": 3, "stream": True},
                {"prompt": f"{marker} " * 20, "max_tokens": 3, "stream": False}]
    with serving(sink.provider) as path:
        results = send(path, sink.provider, requests)
    assert all(r.status_code == 200 for r in results)
    values = list(all_attribute_values(sink.spans()))
    assert values  # the check below looked at something
    assert not [v for v in values if marker in v]
    for span in sink.spans():
        for key in span.attributes or {}:
            assert not key.startswith(attr.GEN_AI_CONTENT_PREFIXES)


def test_ground_truth_splits_every_step_among_its_requests(tmp_path: object) -> None:
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    sink = SpanSink()
    writer = GroundTruthWriter(tmp_path / "truth.jsonl")
    with serving(sink.provider, fast_config(replicas=1), ground_truth=writer) as path:
        results = send(path, sink.provider, workload_requests(12), concurrency=6)
        busy = sum(engine.busy_seconds for engine in path.engines)
        price = path.engines[0].gpu_dollars_per_second
    writer.shutdown()
    truth = read_ground_truth(tmp_path / "truth.jsonl")
    assert set(truth) == {r.trace_id for r in results}
    assert all(row["gpu_seconds"] > 0 for row in truth.values())
    # conservation: the requests' shares add up to the engine's busy time
    assert sum(row["gpu_seconds"] for row in truth.values()) == pytest.approx(busy, rel=1e-9)
    for row in truth.values():
        assert row["gpu_cost_dollars"] == pytest.approx(row["gpu_seconds"] * price)


def _hit_ratio(sink: SpanSink) -> float:
    cached = total = 0
    for span in sink.spans():
        if span.name == attr.VLLM_REQUEST_SPAN_NAME:
            a = span.attributes or {}
            cached += int(a[attr.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS])
            total += int(a[attr.VLLM_USAGE_PROMPT_TOKENS])
    return cached / total


def test_prefix_cache_hit_ratio_rises_with_shared_prefix() -> None:
    ratios = []
    for shared in (0.2, 0.9):
        sink = SpanSink()
        with serving(sink.provider) as path:
            send(path, sink.provider,
                 workload_requests(30, shared_prefix=shared, multi_turn_share=0.1),
                 concurrency=3)
            kv = path.kv_stats()
        ratio = _hit_ratio(sink)
        assert 0.0 < ratio < 1.0
        assert ratio == pytest.approx(kv.hit_ratio)  # spans agree with the caches
        ratios.append(ratio)
    assert ratios[1] > ratios[0]


def test_auth_and_rate_limit_refusals_are_served_and_traced() -> None:
    sink = SpanSink()
    config = fast_config(api_keys=("k-123",), rate_limit_per_second=0.001, rate_limit_burst=1)
    with serving(sink.provider, config) as path:
        ok = send(path, sink.provider, MIXED[:1], api_key="k-123")
        denied = send(path, sink.provider, MIXED[:1], api_key="wrong")
        limited = send(path, sink.provider, MIXED[:1], api_key="k-123")
        raw = httpx.post(f"{path.base_url}/v1/completions", json={"prompt": "x"},
                         headers={"Authorization": "Bearer k-123"})
    assert [r.status_code for r in ok + denied + limited] == [200, 401, 429]
    assert raw.status_code == 429 and int(raw.headers["Retry-After"]) >= 1
    statuses: dict[str, list[str]] = defaultdict(list)
    for spans in sink.by_trace().values():
        gateway = next((s for s in spans if s.name.startswith("POST")), None)
        if gateway is not None:
            stages = {stage for stage, _, _ in stage_entries([gateway])}
            assert StageId.AUTH_RATELIMIT in stages and StageId.API_GATEWAY in stages
            statuses[str((gateway.attributes or {})[attr.STATUS])].append(gateway.name)
            ok = (gateway.attributes or {})[attr.STATUS] == "ok"
            assert (attr.TTFT_SECONDS in (gateway.attributes or {})) is ok
    assert len(statuses["ok"]) == 1 and len(statuses["error"]) == 3
    client_spans = [s for s in sink.spans() if s.name == attr.SPAN_REQUEST]
    assert sorted(s.status.status_code.name for s in client_spans) == ["ERROR", "ERROR",
                                                                        "UNSET"]


def test_engine_metrics_page_in_vllm_format_matches_the_spans() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from tokenpath import metric_names as names

    sink = SpanSink()
    with serving(sink.provider) as path:
        send(path, sink.provider, workload_requests(6))
        page = httpx.get(f"{path.base_url}/metrics").text
    values: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            assert sample.labels[names.VLLM_LABEL_MODEL_NAME] == path.config.engine.model
            values[sample.name] += sample.value
    assert values[names.VLLM_PREFIX_CACHE_HITS + names.COUNTER_SUFFIX] == pytest.approx(
        _hit_ratio(sink) * values[names.VLLM_PREFIX_CACHE_QUERIES + names.COUNTER_SUFFIX])
    assert values[names.VLLM_NUM_REQUESTS_RUNNING] == 0  # all finished
    assert sink.spans()  # /metrics itself is not traced as a request
    assert not [s for s in sink.spans() if s.name.startswith("GET")]
