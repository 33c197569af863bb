"""A request served by a prefill engine and a decode engine: one record, both named.

FIXTURES: the traces are built from the span and attribute names in the projects' own
sources: vLLM's llm_request span and its P/D proxy (examples/online_serving/
disaggregated_serving: the proxy sends the prompt to the prefiller with max_tokens 1, then
to the decoder with the kv_transfer_params the prefiller returned, one request id); llm-d
(the EPP's gateway.request, the routing sidecar on the decode pod calling the prefill pod
first); SGLang's PD mode (``prefill Req``/``decode Req`` request spans,
prefill_transfer_kv_cache); Dynamo's disaggregated workers (engine.generate, disagg_role).
They check tokenpath's mapping of those names, not the projects' behaviour."""

from __future__ import annotations

import pytest

from testkit.fakes.spans import new_trace_id, span
from tokenpath import attributes as A
from tokenpath.collector.assembler import AssembledTrace
from tokenpath.collector.disaggregated import (
    KV_SOURCE_DERIVED,
    KV_SOURCE_RELAYED,
    kv_bytes_per_token,
    split_roles,
)
from tokenpath.collector.mapping import map_calls
from tokenpath.collector.spans import SPAN_KIND_CLIENT, SPAN_KIND_SERVER, SpanData
from tokenpath.records import RequestRecord
from tokenpath.stages import Phase, Provenance, StageId

CHAT = "/v1/chat/completions"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def one_record(spans: list[SpanData]) -> RequestRecord:
    records = map_calls(AssembledTrace(spans[0].trace_id, spans, True, []))
    assert len(records) == 1, [r.record_id for r in records]
    return records[0]


def vllm_engine(tid: str, parent: str, start: float, end: float, *, instance: str,
                node: str, prompt: int, completion: int, queue: float, prefill: float,
                decode: float, request_id: str = "cmpl-pd-1") -> SpanData:
    return span(tid, A.VLLM_REQUEST_SPAN_NAME, parent=parent, kind=SPAN_KIND_SERVER,
                start=start, end=end, attributes={
                    A.GEN_AI_REQUEST_MODEL: MODEL, A.GEN_AI_REQUEST_ID: request_id,
                    A.VLLM_USAGE_PROMPT_TOKENS: prompt,
                    A.VLLM_USAGE_COMPLETION_TOKENS: completion,
                    A.VLLM_LATENCY_TIME_IN_QUEUE: queue,
                    A.VLLM_LATENCY_TIME_IN_MODEL_PREFILL: prefill,
                    A.VLLM_LATENCY_TIME_IN_MODEL_DECODE: decode},
                resource={"service.instance.id": instance, "k8s.node.name": node})


def vllm_pd_proxy_trace(transfer_tokens: int | None = None) -> list[SpanData]:
    """The request of the report: a gateway, the proxy's two client calls, the prefill
    engine (4,000 prompt tokens, 1 output, 0.28 s prefill) and the decode engine (200
    output tokens, 1.72 s decode, its queue wait the KV's arrival)."""
    tid = new_trace_id()
    gateway = span(tid, f"POST {CHAT}", kind=SPAN_KIND_SERVER, start=100.0, end=102.2,
                   attributes={"http.route": CHAT, A.GEN_AI_REQUEST_MODEL: MODEL})
    if transfer_tokens is not None:
        gateway.attributes[A.KV_TRANSFER_TOKENS] = transfer_tokens
    to_prefill = span(tid, "POST prefill", parent=gateway.span_id, kind=SPAN_KIND_CLIENT,
                      start=100.01, end=100.31)
    prefill = vllm_engine(tid, to_prefill.span_id, 100.015, 100.305, instance="prefill-0",
                          node="prefill-0-node", prompt=4000, completion=1, queue=0.005,
                          prefill=0.28, decode=0.0)
    to_decode = span(tid, "POST decode", parent=gateway.span_id, kind=SPAN_KIND_CLIENT,
                     start=100.32, end=102.19)
    decode = vllm_engine(tid, to_decode.span_id, 100.325, 102.18, instance="decode-0",
                         node="decode-0-node", prompt=4000, completion=200, queue=0.12,
                         prefill=0.01, decode=1.72)
    return [gateway, to_prefill, prefill, to_decode, decode]


def test_vllm_pd_proxy_request_is_one_record_with_both_engines() -> None:
    record = one_record(vllm_pd_proxy_trace())
    assert (record.prefill_engine_id, record.prefill_node) == ("prefill-0", "prefill-0-node")
    assert (record.decode_engine_id, record.decode_node) == ("decode-0", "decode-0-node")
    assert (record.engine_id, record.node) == ("decode-0", "decode-0-node")
    assert (record.input_tokens, record.output_tokens) == (4000, 200)
    assert record.prefill_seconds == pytest.approx(0.28)
    assert record.decode_seconds == pytest.approx(1.72)
    # derived: vLLM's decode engine computes the prompt's last token itself
    assert record.kv_transfer_source == KV_SOURCE_DERIVED
    assert record.kv_transfer_tokens == 3999
    per_token = kv_bytes_per_token(MODEL)
    assert per_token is not None and per_token > 0
    assert record.kv_transfer_bytes == round(3999 * per_token)
    # TTFT as the client saw it: from the gateway's start to the decode engine's first
    # token (prefill, the transfer, the decode's first step), not the prefill's 0.29 s
    assert record.ttft_seconds == pytest.approx(102.18 - 1.72 - 100.0)
    # the prefill engine's queue is queueing; the decode engine's is the KV transfer
    assert record.stages[StageId.SCHEDULER_QUEUE].seconds == pytest.approx(0.005)
    transfer = record.stages[StageId.NIC_TX]
    assert transfer.phases[Phase.KV_TRANSFER].seconds == pytest.approx(0.12)
    assert transfer.provenance is Provenance.DERIVED
    assert record.decode_start_unix == pytest.approx(102.18 - 1.72)
    assert record.prefill_start_unix == pytest.approx(100.305 - 0.28)


def test_relayed_kv_transfer_params_count_wins() -> None:
    record = one_record(vllm_pd_proxy_trace(transfer_tokens=3968))
    assert record.kv_transfer_source == KV_SOURCE_RELAYED
    assert record.kv_transfer_tokens == 3968


def test_both_engines_on_one_node_transfer_on_nvlink() -> None:
    spans = vllm_pd_proxy_trace()
    spans[4].resource["k8s.node.name"] = "prefill-0-node"
    record = one_record(spans)
    assert record.prefill_node == record.decode_node == "prefill-0-node"
    assert record.prefill_engine_id != record.decode_engine_id
    assert Phase.KV_TRANSFER in record.stages[StageId.NVLINK].phases
    assert StageId.NIC_TX not in record.stages


def test_llm_d_sidecar_calls_the_prefill_pod_then_decodes() -> None:
    """llm-d: the EPP (gateway.request) picks the decode pod; its routing sidecar sends
    the prompt to the prefill pod first (max_tokens 1), then to the vLLM beside it."""
    tid = new_trace_id()
    gateway = span(tid, "gateway.request", kind=SPAN_KIND_SERVER, start=0.0, end=3.0)
    prefill = vllm_engine(tid, gateway.span_id, 0.01, 0.6, instance="p", node="n1",
                          prompt=2000, completion=1, queue=0.02, prefill=0.5, decode=0.0)
    decode = vllm_engine(tid, gateway.span_id, 0.62, 2.9, instance="d", node="n2",
                         prompt=2000, completion=120, queue=0.08, prefill=0.01, decode=2.1)
    for engine, pod in ((prefill, "vllm-prefill-7f9c"), (decode, "vllm-decode-5d2a")):
        engine.resource.pop("service.instance.id")
        engine.resource["k8s.pod.name"] = pod
    record = one_record([gateway, prefill, decode])
    assert (record.prefill_engine_id, record.decode_engine_id) == ("vllm-prefill-7f9c",
                                                                   "vllm-decode-5d2a")
    assert (record.prefill_node, record.decode_node) == ("n1", "n2")
    assert (record.input_tokens, record.output_tokens) == (2000, 120)
    assert 0 < (record.kv_transfer_tokens or 0) <= record.input_tokens


def test_sglang_pd_roles_from_the_request_span_names() -> None:
    tid = new_trace_id()

    def root(role: str, start: float, end: float, completion: int, prefill: float,
             decode: float, host: str) -> SpanData:
        return span(tid, f"{role} Req 1a2b3c4d", start=start, end=end, attributes={
            "module": "sglang::request", A.GEN_AI_REQUEST_ID: "1a2b3c4d5e6f",
            A.GEN_AI_RESPONSE_MODEL: MODEL, A.VLLM_USAGE_PROMPT_TOKENS: 900,
            A.VLLM_USAGE_COMPLETION_TOKENS: completion,
            A.VLLM_LATENCY_TIME_IN_MODEL_PREFILL: prefill,
            A.VLLM_LATENCY_TIME_IN_MODEL_DECODE: decode}, resource={"host.name": host})

    prefill = root("prefill", 10.0, 10.4, 1, 0.25, 0.0, "gpu-a")
    transfer = span(tid, "prefill_transfer_kv_cache", parent=prefill.span_id, start=10.3,
                    end=10.38)
    # the decode root ends last, but here it also starts first: the name decides
    decode = root("decode", 9.99, 11.2, 64, 0.0, 0.8, "gpu-b")
    record = one_record([prefill, transfer, decode])
    assert (record.prefill_node, record.decode_node) == ("gpu-a", "gpu-b")
    assert record.output_tokens == 64
    assert record.kv_transfer_tokens == 900  # SGLang sends the whole prompt's KV
    nic = record.stages[StageId.NIC_TX]  # measured by SGLang, kept
    assert nic.phases[Phase.KV_TRANSFER].seconds == pytest.approx(0.08)
    assert nic.provenance is Provenance.MEASURED


def test_dynamo_disaggregated_workers() -> None:
    tid = new_trace_id()
    frontend = span(tid, "http-request", kind=SPAN_KIND_SERVER, start=0.0, end=2.0,
                    attributes={"method": "POST", "uri": CHAT})
    engines = []
    for role, start, end, out, instance in (("prefill", 0.05, 0.4, 1, "worker-p"),
                                            ("decode", 0.1, 1.95, 50, "worker-d")):
        engines.append(span(tid, "engine.generate", parent=frontend.span_id, start=start,
                            end=end, attributes={
                                "model": MODEL, "input_tokens": 300, "output_tokens": out,
                                "ttft_ms": 300.0 if role == "prefill" else 400.0,
                                "disagg_role": role, A.GEN_AI_REQUEST_ID: "dyn-1"},
                            resource={"service.instance.id": instance}))
    record = one_record([frontend, *engines])
    assert (record.prefill_engine_id, record.decode_engine_id) == ("worker-p", "worker-d")
    assert record.output_tokens == 50
    assert record.engine == "dynamo"
    assert record.kv_transfer_tokens == 300


def test_one_engine_is_not_disaggregated() -> None:
    tid = new_trace_id()
    engine = vllm_engine(tid, "", 0.0, 1.0, instance="e", node="n", prompt=10,
                         completion=5, queue=0.0, prefill=0.1, decode=0.8)
    record = one_record([engine])
    assert record.prefill_engine_id is None and record.kv_transfer_tokens is None
    assert split_roles([engine]) is None


def test_a_failed_attempt_before_a_retry_is_not_a_prefill() -> None:
    tid = new_trace_id()
    first = vllm_engine(tid, "", 0.0, 0.5, instance="a", node="n1", prompt=10,
                        completion=0, queue=0.0, prefill=0.1, decode=0.0)
    first.status_code = 2  # error
    second = vllm_engine(tid, "", 0.6, 1.5, instance="b", node="n2", prompt=10,
                         completion=5, queue=0.0, prefill=0.1, decode=0.7)
    assert split_roles([first, second]) is None


def test_identity_is_one_engines_never_a_key_from_each() -> None:
    """Two engines of one call, the first naming its node by tokenpath.node and the second
    by k8s.node.name: the record's node and engine are both the answering engine's."""
    tid = new_trace_id()
    first = vllm_engine(tid, "", 0.0, 0.5, instance="a", node="n-a", prompt=10,
                        completion=0, queue=0.0, prefill=0.1, decode=0.0)
    first.status_code = 2  # a failed attempt, retried on another engine
    first.resource.pop("k8s.node.name")
    first.attributes[A.NODE] = "n-a"
    second = vllm_engine(tid, "", 0.6, 1.5, instance="b", node="n-b", prompt=10,
                         completion=5, queue=0.0, prefill=0.1, decode=0.7)
    record = one_record([first, second])
    assert (record.node, record.engine_id) == ("n-b", "b")
