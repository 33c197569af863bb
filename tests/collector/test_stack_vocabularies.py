"""Spans of other serving stacks, understood natively.

FIXTURES: SGLang's engine, NVIDIA Dynamo and llm-d's inference scheduler cannot run on
these machines, and LiteLLM's proxy is not installed here; these traces are built from the
span and attribute names in their sources (collector/stack_vocabularies.py and
docs/stages.md cite the files). They check the mapping of those names, not the projects'
own behaviour."""

from __future__ import annotations

import pytest

from testkit.fakes.spans import new_trace_id, span
from tokenpath import attributes as A
from tokenpath.collector.assembler import AssembledTrace
from tokenpath.collector.mapping import map_calls
from tokenpath.collector.spans import SPAN_KIND_CLIENT, SPAN_KIND_SERVER, SpanData
from tokenpath.stages import Provenance, StageId

CHAT = "/v1/chat/completions"


def _one(spans: list[SpanData]):  # type: ignore[no-untyped-def]
    records = map_calls(AssembledTrace(spans[0].trace_id, spans, True, []))
    assert len(records) == 1, records
    return records[0]


def _vllm_engine(tid: str, parent: str, start: float, end: float, prompt: int,
                 completion: int, queue: float, prefill: float, decode: float) -> SpanData:
    return span(tid, A.VLLM_REQUEST_SPAN_NAME, parent=parent, kind=SPAN_KIND_SERVER,
                start=start, end=end, attributes={
                    A.GEN_AI_REQUEST_MODEL: "llama-3.1-8b", A.VLLM_USAGE_PROMPT_TOKENS: prompt,
                    A.VLLM_USAGE_COMPLETION_TOKENS: completion,
                    A.VLLM_LATENCY_TIME_IN_QUEUE: queue,
                    A.VLLM_LATENCY_TIME_IN_MODEL_PREFILL: prefill,
                    A.VLLM_LATENCY_TIME_IN_MODEL_DECODE: decode})


def _sglang_root(tid: str, role: str, start: float, end: float, prefill: float,
                 decode: float, **extra: object) -> SpanData:
    return span(tid, f"{role} Req 1a2b3c4d", start=start, end=end, attributes={
        "module": "sglang::request", "rid": "1a2b3c4d5e6f", A.GEN_AI_REQUEST_ID: "1a2b3c4d5e6f",
        A.GEN_AI_RESPONSE_MODEL: "llama-3.1-8b", A.VLLM_USAGE_PROMPT_TOKENS: 900,
        A.VLLM_USAGE_COMPLETION_TOKENS: 64, A.GEN_AI_USAGE_CACHED_TOKENS: 512,
        A.VLLM_LATENCY_TIME_IN_MODEL_PREFILL: prefill,
        A.VLLM_LATENCY_TIME_IN_MODEL_DECODE: decode,
        A.VLLM_LATENCY_TIME_TO_FIRST_TOKEN: prefill + 0.01, **extra})


def test_sglang_request_root_and_slices() -> None:
    tid = "0" * 16 + new_trace_id()[16:]  # SGLang draws 64-bit trace ids
    root = _sglang_root(tid, "", 10.0, 11.0, 0.2, 0.7)
    thread = span(tid, "Scheduler [TP 0] (host:abcd1234 | pid:7)", parent=root.span_id,
                  start=10.0, end=11.0)
    waiting = span(tid, "prefill_waiting", parent=thread.span_id, start=10.0, end=10.08)
    forward = span(tid, "prefill_forward", parent=thread.span_id, start=10.08, end=10.28)
    record = _one([root, thread, waiting, forward])
    assert record.engine == "sglang"
    assert (record.input_tokens, record.output_tokens, record.cache_read_tokens) == (900, 64, 512)
    assert record.stages[StageId.SCHEDULER_QUEUE].seconds == pytest.approx(0.08)
    assert record.prefill_seconds == pytest.approx(0.2)
    assert record.engine_end_unix == pytest.approx(11.0)


def test_sglang_prefill_and_decode_nodes_are_one_request() -> None:
    tid = new_trace_id()
    prefill = _sglang_root(tid, "prefill", 10.0, 10.3, 0.25, 0.0)
    decode = _sglang_root(tid, "decode", 10.1, 11.2, 0.0, 0.9)
    record = _one([prefill, decode])
    assert record.input_tokens == 900
    assert record.prefill_seconds == pytest.approx(0.25)
    assert record.decode_seconds == pytest.approx(0.9)


def test_dynamo_frontend_router_and_engine() -> None:
    tid = new_trace_id()
    frontend = span(tid, "http-request", kind=SPAN_KIND_SERVER, start=0.0, end=2.0,
                    attributes={"method": "POST", "uri": CHAT})
    route = span(tid, "kv_router.route_request", parent=frontend.span_id,
                 kind=SPAN_KIND_CLIENT, start=0.01, end=1.99,
                 attributes={"request_id": "r1", "worker_id": 7, "overlap_blocks": 4})
    payload = span(tid, "handle_payload", parent=route.span_id, kind=SPAN_KIND_SERVER,
                   start=0.02, end=1.98)
    engine = span(tid, "engine.generate", parent=payload.span_id, start=0.05, end=1.95,
                  attributes={"model": "llama-3.1-8b", "input_tokens": 300,
                              "output_tokens": 50, "ttft_ms": 150.0, "disagg_role": "agg"})
    record = _one([frontend, route, payload, engine])
    assert record.engine == "dynamo"
    assert record.model == "llama-3.1-8b"
    assert (record.input_tokens, record.output_tokens) == (300, 50)
    assert record.prefill_seconds == pytest.approx(0.15)
    assert record.decode_seconds == pytest.approx(1.75)
    gateway = record.stages[StageId.API_GATEWAY]
    assert gateway.provenance is Provenance.DERIVED
    assert gateway.seconds == pytest.approx(2.0 - 1.9)


def test_llm_d_gateway_and_scheduling_in_front_of_vllm() -> None:
    tid = new_trace_id()
    gateway = span(tid, "gateway.request", kind=SPAN_KIND_SERVER, start=0.0, end=1.0)
    orchestration = span(tid, "gateway.request_orchestration", parent=gateway.span_id,
                         kind=SPAN_KIND_SERVER, start=0.001, end=0.004,
                         attributes={"target_model": "llama-3.1-8b", "request_prio": 0})
    scorer = span(tid, "llm_d.epp.scorer.prefix_cache", parent=orchestration.span_id,
                  start=0.002, end=0.003, attributes={"llm_d.scorer.score.max": 0.8})
    engine = _vllm_engine(tid, gateway.span_id, 0.01, 0.95, 100, 20, 0.01, 0.05, 0.8)
    engine.attributes[A.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] = 48
    record = _one([gateway, orchestration, scorer, engine])
    # the router predicted 80 % of the prompt cached; the engine read 48 %
    assert record.router_predicted_cache_hit == pytest.approx(0.8)
    assert record.cache_read_tokens == 48
    assert record.stages[StageId.ROUTER].seconds == pytest.approx(0.003)
    # the gateway's own time: less the engine and less the scheduling timed apart
    assert record.stages[StageId.API_GATEWAY].seconds == pytest.approx(1.0 - 0.94 - 0.003)


def test_litellm_auth_router_and_upstream_wait_behind_which_a_gateway_sits() -> None:
    tid = new_trace_id()
    proxy = span(tid, "Received Proxy Server Request", kind=SPAN_KIND_SERVER, start=0.0,
                 end=24.0, attributes={A.GEN_AI_REQUEST_MODEL: "llama-3.1-8b"})
    auth = span(tid, "auth", parent=proxy.span_id, start=0.001, end=0.004)
    router = span(tid, "router", parent=proxy.span_id, start=0.005, end=0.006)
    upstream = span(tid, "litellm_request", parent=proxy.span_id, kind=SPAN_KIND_CLIENT,
                    start=0.01, end=23.61, attributes={A.GEN_AI_USAGE_INPUT_TOKENS: 99,
                                                       "gen_ai.response.id": "chatcmpl-1"})
    gateway = span(tid, f"POST {CHAT}", parent=upstream.span_id, kind=SPAN_KIND_SERVER,
                   start=0.02, end=23.6, attributes={"http.route": CHAT})
    engine = _vllm_engine(tid, gateway.span_id, 0.03, 23.5, 120, 900, 0.1, 0.4, 22.9)
    record = _one([proxy, auth, router, upstream, gateway, engine])  # one record, not two
    assert record.input_tokens == 120  # the engine's count
    assert record.stages[StageId.AUTH_RATELIMIT].seconds == pytest.approx(0.003)
    assert record.stages[StageId.ROUTER].seconds == pytest.approx(0.001)
    # the proxy's own overhead: not its 23.6 s upstream wait, not auth and router
    assert record.stages[StageId.API_GATEWAY].seconds == pytest.approx(
        24.0 - 23.6 - 0.003 - 0.001)


def test_pd_engines_behind_separate_client_spans_are_one_request() -> None:
    """A P/D proxy calls the prefill and the decode engine through two HTTP client spans;
    the engines' spans share the request id: one call, the input counted once."""
    tid = new_trace_id()
    gateway_attrs = {"http.route": CHAT, A.GEN_AI_REQUEST_MODEL: "llama-3.1-8b"}
    root = span(tid, "proxy", start=0.0, end=2.0)
    records_spans = [root]
    for role, start, completion in (("prefill", 0.1, 1), ("decode", 0.4, 40)):
        client = span(tid, f"POST {role}", parent=root.span_id, kind=SPAN_KIND_CLIENT,
                      start=start, end=start + 1.2,
                      attributes={A.GEN_AI_OPERATION_NAME: "chat", **gateway_attrs})
        engine = _vllm_engine(tid, client.span_id, start + 0.01, start + 1.1, 500, completion,
                              0.01, 0.2, 0.8)
        engine.attributes[A.GEN_AI_REQUEST_ID] = "pd-request-1"
        records_spans += [client, engine]
    record = _one(records_spans)
    assert record.input_tokens == 500


def test_openllmetry_old_names_client_span_is_a_call_with_its_tokens() -> None:
    """FIXTURE: OpenLLMetry before the GenAI conventions (opentelemetry-semconv-ai 0.3):
    `openai.chat` CLIENT span with gen_ai.system, llm.request.type and the
    prompt/completion token names."""
    tid = new_trace_id()
    client = span(tid, "openai.chat", kind=SPAN_KIND_CLIENT, start=0.0, end=1.2, attributes={
        "gen_ai.system": "OpenAI", "llm.request.type": "chat",
        A.GEN_AI_REQUEST_MODEL: "llama-3.1-8b", A.VLLM_USAGE_PROMPT_TOKENS: 31,
        A.VLLM_USAGE_COMPLETION_TOKENS: 9, "llm.usage.total_tokens": 40})
    record = _one([client])
    assert (record.input_tokens, record.output_tokens) == (31, 9)
    assert record.outer_hop == "client"  # joined to its serving side if it comes


def test_sglang_pd_prefill_bootstrap_is_queueing_on_the_prefill_node() -> None:
    tid = new_trace_id()
    prefill = _sglang_root(tid, "prefill", 10.0, 10.4, 0.25, 0.0)
    bootstrap = span(tid, "prefill_bootstrap", parent=prefill.span_id, start=10.0, end=10.05)
    decode = _sglang_root(tid, "decode", 10.01, 11.2, 0.0, 0.9)
    decode_bootstrap = span(tid, "decode_bootstrap", parent=decode.span_id, start=10.01,
                            end=10.3)  # beside the prefill: not added
    record = _one([prefill, bootstrap, decode, decode_bootstrap])
    assert record.stages[StageId.SCHEDULER_QUEUE].seconds == pytest.approx(0.05)


def test_stage_slices_under_a_propagating_litellm_keep_their_time() -> None:
    """Only LiteLLM's own service spans lose their overlap with its upstream call; an
    SGLang slice inside that call (traceparent forwarded) keeps its 0.5 s."""
    tid = new_trace_id()
    proxy = span(tid, "Received Proxy Server Request", kind=SPAN_KIND_SERVER, start=0.0,
                 end=3.0, attributes={"http.route": CHAT})
    upstream = span(tid, "litellm_request", parent=proxy.span_id, start=0.1, end=2.9)
    root = _sglang_root(tid, "", 0.2, 2.8, 0.2, 1.8)
    root.parent_span_id = upstream.span_id
    waiting = span(tid, "prefill_waiting", parent=root.span_id, start=0.2, end=0.7)
    record = _one([proxy, upstream, root, waiting])
    assert record.stages[StageId.SCHEDULER_QUEUE].seconds == pytest.approx(0.5)
