"""Span attribute, event and span names that tokenpath emits or understands.

docs/reference.md, "Span conventions". OpenTelemetry GenAI names where they exist,
``tokenpath.*`` for the rest, and the names vLLM's native tracing uses.
"""

from __future__ import annotations

from typing import Final

# --- OpenTelemetry GenAI semantic conventions -------------------------------------------
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_RESPONSE_ID: Final = "gen_ai.response.id"  # the completion's id on every hop
GEN_AI_REQUEST_ID: Final = "gen_ai.request.id"
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"  # "chat", "text_completion", ...
# Seconds from the client issuing the request to the first streamed chunk (client spans).
GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: Final = "gen_ai.response.time_to_first_chunk"
# OpenLIT's time to first token on its CLIENT span, as the client measured it (first chunk
# less the call's start; a whole call's duration when not streamed), despite the name.
OPENLIT_CLIENT_TTFT: Final = "gen_ai.server.time_to_first_token"
# OpenLLMetry's event per streamed chunk on its client span (opentelemetry-instrumentation-
# openai, shared/chat_wrappers.py): the first one is the client's first token.
OPENLLMETRY_CHUNK_EVENT: Final = "gen_ai.content.completion.chunk"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
# Prompt tokens written to the cache (vLLM's usage.prompt_tokens_details.created_cache_tokens).
GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS: Final = "gen_ai.usage.cache_creation.input_tokens"
# Other spellings of the cached input tokens: SGLang's spans, OpenInference's.
GEN_AI_USAGE_CACHED_TOKENS: Final = "gen_ai.usage.cached_tokens"
OPENINFERENCE_CACHE_READ_TOKENS: Final = "llm.token_count.prompt_details.cache_read"
OPENINFERENCE_PROMPT_TOKENS: Final = "llm.token_count.prompt"
OPENINFERENCE_COMPLETION_TOKENS: Final = "llm.token_count.completion"
OPENINFERENCE_TOTAL_TOKENS: Final = "llm.token_count.total"
# OpenInference (openinference-instrumentation-openai): a call is one INTERNAL span named
# after the API (``ChatCompletion``) whose span kind attribute is OPENINFERENCE_KIND_LLM; it
# names the model (the response's) and the provider, never a response id.
OPENINFERENCE_SPAN_KIND: Final = "openinference.span.kind"
OPENINFERENCE_KIND_LLM: Final = "LLM"  # the value of OPENINFERENCE_SPAN_KIND on a call
OPENINFERENCE_MODEL_NAME: Final = "llm.model_name"
OPENINFERENCE_SYSTEM: Final = "llm.system"  # "openai", ...
OPENINFERENCE_INVOCATION_PARAMETERS: Final = "llm.invocation_parameters"  # JSON, no messages
# OpenInference's event on a streamed call's span when the first chunk arrived.
OPENINFERENCE_FIRST_TOKEN_EVENT: Final = "First Token Stream Event"
HTTP_STATUS_CODE_OLD: Final = "http.status_code"  # pre-1.21 HTTP semantic conventions
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
GEN_AI_REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
# A response's usage.completion_tokens_details.reasoning_tokens (no GenAI name yet).
USAGE_REASONING_TOKENS: Final = "tokenpath.usage.reasoning_tokens"

# Content-bearing GenAI attributes: dropped on ingest unless explicitly opted in.
GEN_AI_CONTENT_PREFIXES: Final = (
    "gen_ai.prompt",
    "gen_ai.completion",
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
    # the same content under other instrumentations' keys
    "llm.openai.messages", "llm.openai.choices",  # LiteLLM's OpenTelemetry callback
    "traceloop.entity.input", "traceloop.entity.output",  # Traceloop / OpenLLMetry
    "llm.prompts", "llm.completions",  # OpenLLMetry's older names
    "input.value", "output.value", "llm.input_messages", "llm.output_messages",
    "llm.prompt_template",  # OpenInference
)
# GenAI span events whose attributes or body carry message content: dropped whole on ingest
# unless content is explicitly opted in (older event-based GenAI conventions).
GEN_AI_CONTENT_EVENT_NAMES: Final = frozenset({
    "gen_ai.content.prompt",
    "gen_ai.content.completion",
    "gen_ai.system.message",
    "gen_ai.user.message",
    "gen_ai.assistant.message",
    "gen_ai.tool.message",
    "gen_ai.choice",
    "gen_ai.client.inference.operation.details",
})

# --- vLLM's native llm_request span (vllm/tracing.py SpanAttributes) ----------------------
VLLM_REQUEST_SPAN_NAME: Final = "llm_request"
VLLM_USAGE_PROMPT_TOKENS: Final = "gen_ai.usage.prompt_tokens"  # deprecated GenAI name
VLLM_USAGE_COMPLETION_TOKENS: Final = "gen_ai.usage.completion_tokens"  # deprecated
VLLM_USAGE_NUM_SEQUENCES: Final = "gen_ai.usage.num_sequences"
VLLM_LATENCY_TIME_IN_QUEUE: Final = "gen_ai.latency.time_in_queue"
VLLM_LATENCY_TIME_TO_FIRST_TOKEN: Final = "gen_ai.latency.time_to_first_token"
VLLM_LATENCY_E2E: Final = "gen_ai.latency.e2e"
VLLM_LATENCY_TIME_IN_SCHEDULER: Final = "gen_ai.latency.time_in_scheduler"
VLLM_LATENCY_TIME_IN_MODEL_FORWARD: Final = "gen_ai.latency.time_in_model_forward"
VLLM_LATENCY_TIME_IN_MODEL_EXECUTE: Final = "gen_ai.latency.time_in_model_execute"
VLLM_LATENCY_TIME_IN_MODEL_PREFILL: Final = "gen_ai.latency.time_in_model_prefill"
VLLM_LATENCY_TIME_IN_MODEL_DECODE: Final = "gen_ai.latency.time_in_model_decode"
VLLM_LATENCY_TIME_IN_MODEL_INFERENCE: Final = "gen_ai.latency.time_in_model_inference"
# vLLM's per-request ``metrics`` of a response (``--enable-per-request-metrics``), read by
# the gateway shim and the vLLM proxy onto their server span; queue_time_ms,
# time_to_first_token_ms (first token less scheduling: the prefill) and generation_time_ms
# go under the three gen_ai.latency names above in seconds. Its mean_itl_ms, in seconds:
VLLM_MEAN_ITL_SECONDS: Final = "tokenpath.engine.mean_itl_seconds"
# Its tokens_per_second (generated tokens over the time from scheduling to the last token).
VLLM_TOKENS_PER_SECOND: Final = "tokenpath.engine.tokens_per_second"
# Also on llm_request in vLLM 0.32 (seen live, docs/vllm.md), when the request set them.
VLLM_REQUEST_TOP_P: Final = "gen_ai.request.top_p"
VLLM_REQUEST_TEMPERATURE: Final = "gen_ai.request.temperature"
VLLM_REQUEST_N: Final = "gen_ai.request.n"

# --- OpenTelemetry resource semantic conventions (engine identity) -------
K8S_NODE_NAME: Final = "k8s.node.name"
HOST_NAME: Final = "host.name"
K8S_POD_UID: Final = "k8s.pod.uid"
K8S_POD_NAME: Final = "k8s.pod.name"
SERVICE_INSTANCE_ID: Final = "service.instance.id"
SERVICE_NAME: Final = "service.name"

# --- tokenpath ---------------------------------------------------------------------------
STAGE: Final = "tokenpath.stage"
PHASE: Final = "tokenpath.phase"
PROVENANCE: Final = "tokenpath.provenance"
PREFIX_FINGERPRINTS: Final = "tokenpath.prefix.fingerprints"
PREFIX_BLOCK_TOKENS: Final = "tokenpath.prefix.block_tokens"
NODE: Final = "tokenpath.node"
POOL: Final = "tokenpath.pool"
GPU_TYPE: Final = "tokenpath.gpu.type"
TENSOR_PARALLEL: Final = "tokenpath.gpu.tensor_parallel"
ENGINE: Final = "tokenpath.engine"  # "simulated", "vllm", ...
ENGINE_REPLICA: Final = "tokenpath.engine.replica"
ENGINE_ID: Final = "tokenpath.engine.id"  # the engine (GPU set) on its node: the pricing unit
SIMULATED: Final = "tokenpath.simulated"
ENGINE_ROLE: Final = "tokenpath.engine.role"  # disaggregated: "prefill" or "decode"
KV_TRANSFER_TOKENS: Final = "tokenpath.kv_transfer.tokens"  # a P/D proxy relayed: KV tokens
STATUS: Final = "tokenpath.request.status"
CACHED_TOKENS: Final = "tokenpath.kv.cached_tokens"
PREEMPTIONS: Final = "tokenpath.request.preemptions"
RESPONSE_BYTES: Final = "tokenpath.response.bytes"
RESPONSE_CHUNKS: Final = "tokenpath.response.chunks"
RESPONSE_SMALL_CHUNKS: Final = "tokenpath.response.small_chunks"
RESPONSE_WRITE_SECONDS: Final = "tokenpath.response.write_seconds"
LINK_BITS_PER_SECOND: Final = "tokenpath.network.link_bits_per_second"
STREAMING: Final = "tokenpath.request.streaming"

# Engine step (iteration) data, one span event per step a request took part in is too
# many; the engine hook summarizes the steps a request shared on its phase span.
STEP_COUNT: Final = "tokenpath.engine.steps"
STEP_SECONDS: Final = "tokenpath.engine.step_seconds"

# Span names tokenpath's own shims use.
SPAN_REQUEST: Final = "tokenpath.request"
SPAN_STAGE_PREFIX: Final = "tokenpath.stage."

# --- Stage recording contract --------------------------------------------------------
# A stage is timed in one of two ways, both read by the collector's stage mapping:
#  1. a span carrying STAGE: the stage lasts the span's duration;
#  2. a span event named STAGE_EVENT carrying STAGE and STAGE_SECONDS (the cheap hook
#     API records many stages on one span this way; the event time is the stage's end).
# Either may carry PHASE (prefill/decode) and PROVENANCE (default: measured).
STAGE_EVENT: Final = "tokenpath.stage"
STAGE_SECONDS: Final = "tokenpath.stage.seconds"

# Time to first token as the client or gateway saw it (preferred over the engine's).
TTFT_SECONDS: Final = "tokenpath.ttft_seconds"
# Engine-side work summary of a request, used by cost attribution.
PREFILL_NEW_TOKENS: Final = "tokenpath.prefill.new_tokens"

# A span with this name carries facts about a request identified by GEN_AI_REQUEST_ID that
# live in another trace (vLLM's stat-logger plugin cannot see the trace context). The
# collector joins its attributes into the trace whose engine span has the same request id.
SPAN_REQUEST_ANNOTATION: Final = "tokenpath.request_annotation"

# --- OpenTelemetry HTTP semantic conventions (gateway and client shims) --------------------
HTTP_REQUEST_METHOD: Final = "http.request.method"
HTTP_RESPONSE_STATUS_CODE: Final = "http.response.status_code"
URL_PATH: Final = "url.path"
HTTP_ROUTE: Final = "http.route"
# TCP segments the gateway's response became (input of the derived network stages 11-13).
RESPONSE_PACKETS: Final = "tokenpath.response.packets"

# --- vLLM stat-logger plugin (tokenpath.instrumentation.vllm) ------------------------------
# Per-request step summary on SPAN_REQUEST_ANNOTATION: over the engine steps (iterations)
# that ran while the request was being served, the batch's scheduled prefill and decode
# tokens summed, and the largest batch seen. STEP_COUNT / STEP_SECONDS above carry the
# number of those steps and their summed duration. Derived: a step is attributed to every
# request in flight when it ran.
STEP_PREFILL_TOKENS: Final = "tokenpath.engine.step.prefill_tokens"
STEP_DECODE_TOKENS: Final = "tokenpath.engine.step.decode_tokens"
STEP_MAX_BATCH_REQUESTS: Final = "tokenpath.engine.step.max_batch_requests"
# Where STEP_SECONDS came from: "measured" (vLLM's iteration details, elapsed per step) or
# "derived" (gaps between the frontend's iteration timestamps).
STEP_SECONDS_SOURCE: Final = "tokenpath.engine.step_seconds.source"

# A span with this name summarizes the engine's steps over one export interval (span start
# and end bound the interval); it is not a request. Carries STEP_COUNT, STEP_SECONDS,
# STEP_PREFILL_TOKENS, STEP_DECODE_TOKENS, STEP_MAX_BATCH_REQUESTS, STEP_SECONDS_SOURCE,
# ENGINE, and the exporter's own health below.
SPAN_ENGINE_STEPS: Final = "tokenpath.engine_steps"
# Cumulative counts of the plugin's exporter: items dropped because its bounded queue was
# full, and span batches the OTLP exporter failed to send.
EXPORT_DROPPED: Final = "tokenpath.export.dropped"
EXPORT_FAILED_BATCHES: Final = "tokenpath.export.failed_batches"

# Who the request is for (the gateway shim's, instrumentation/tenants.py; or any span's):
# the chargeback unit.
TENANT: Final = "tokenpath.tenant"

