"""Span names of serving stacks the collector understands natively, from their sources.

Each table says what a span of another project means on the 15-stage path; docs/stages.md
lists them with the files they were read from. Where a project's engine cannot run here
(SGLang, Dynamo, llm-d's scheduler), the tests build fixtures from these names and say so.
"""

from __future__ import annotations

from typing import Final

from tokenpath.stages import StageId

# --- engine spans ---------------------------------------------------------------------
# SGLang (--enable-trace, python/sglang/srt/observability/trace.py): the request root is
# "{role} Req {rid[:8]}" with module "sglang::request"; it carries vLLM's gen_ai.latency.*
# and gen_ai.usage.* names. Prefill and decode nodes of a disaggregated (P/D) request each
# emit one, with the same gen_ai.request.id.
SGLANG_MODULE_ATTRIBUTE: Final = "module"
SGLANG_REQUEST_MODULE: Final = "sglang::request"
# NVIDIA Dynamo (lib/backend-common/src/adapter.rs): the worker's engine.generate span, with
# its own token and TTFT fields (no gen_ai.latency.*).
DYNAMO_ENGINE_SPAN: Final = "engine.generate"
DYNAMO_INPUT_TOKENS: Final = "input_tokens"
DYNAMO_OUTPUT_TOKENS: Final = "output_tokens"
DYNAMO_TTFT_MS: Final = "ttft_ms"
DYNAMO_MODEL: Final = "model"
DYNAMO_DISAGG_ROLE: Final = "disagg_role"  # "prefill", "decode" or "agg"

# --- gateway spans: the LLM front door of a request (api_gateway, derived) ------------------
LITELLM_PROXY_SPAN: Final = "Received Proxy Server Request"  # litellm/integrations/opentelemetry.py
DYNAMO_FRONTEND_SPAN: Final = "http-request"  # lib/runtime/src/logging.rs
GIE_GATEWAY_SPAN: Final = "gateway.request"  # llm-d scheduler / GIE EPP, handlers/server.go
GATEWAY_SPAN_NAMES: Final = frozenset({LITELLM_PROXY_SPAN, DYNAMO_FRONTEND_SPAN,
                                       GIE_GATEWAY_SPAN})

# --- spans that time one stage (measured, their own duration) ----------------------------
NAMED_STAGE_SPANS: Final[dict[str, StageId]] = {
    "auth": StageId.AUTH_RATELIMIT,  # LiteLLM service span (ServiceTypes.AUTH)
    "router": StageId.ROUTER,  # LiteLLM service span (ServiceTypes.ROUTER)
    "gateway.request_orchestration": StageId.ROUTER,  # llm-d/GIE director: scheduling
    "prefill_waiting": StageId.SCHEDULER_QUEUE,  # SGLang slice
    "decode_waiting": StageId.SCHEDULER_QUEUE,  # SGLang slice (P/D decode node)
    # SGLang P/D prefill node: bootstrap queue to waiting queue (the handshake with the
    # decode node and the wait for it). The decode node's decode_bootstrap runs beside the
    # prefill, so it is not added.
    "prefill_bootstrap": StageId.SCHEDULER_QUEUE,
}

# --- disaggregated prefill/decode: the KV transfer, timed on the network stages -----------
# SGLang (srt/observability/req_time_stats.py): prefill_transfer_kv_cache runs from the
# request entering the prefill engine's transfer queue to the end of its KV transfer to
# the decode engine (Mooncake / NIXL over the RDMA NIC). The decode side's
# decode_transferred slice also holds the wait for the prefill, so it is not read.
KV_TRANSFER_SPANS: Final[dict[str, StageId]] = {
    "prefill_transfer_kv_cache": StageId.NIC_TX,
}

# --- the router's predicted prefix-cache hit ------------------------------------------------
# llm-d's precise prefix-cache scorer (llm-d-inference-scheduler, pkg/plugins/scorer/
# precise_prefix_cache.go): matched blocks / the request's blocks of the best candidate.
LLMD_PREFIX_SCORER_SPAN: Final = "llm_d.epp.scorer.prefix_cache"
LLMD_SCORE_MAX: Final = "llm_d.scorer.score.max"

# LiteLLM's service spans, which may hold its upstream call (less its overlap with it)
LITELLM_SERVICE_SPANS: Final = frozenset({"auth", "router"})

# --- a proxy's upstream call: its wait is not gateway time ---------------------------------
UPSTREAM_SPAN_NAMES: Final = frozenset({"litellm_request", "raw_gen_ai_request"})
