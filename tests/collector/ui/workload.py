"""A short synthetic workload sent through the real OpenTelemetry SDK and OTLP exporter.

Each request is a root span carrying request-level attributes and the client, gateway and
network stages as STAGE_EVENT events, with a vLLM-shaped ``llm_request`` child span carrying
vLLM's latency attributes plus the engine's own stage events (KV lookup, dispatch per phase,
modeled NVLink). Together with the collector's split of in-model time into kernel_exec and
hbm_load, every one of the 15 stages is recorded. Requests are spread over the last few
minutes (explicit span times) and share a few system prompts, so the cache views have a
trend and repeated prefixes. Fingerprints are opaque hex strings: no content anywhere.
"""

from __future__ import annotations

import hashlib
import random
import time
from dataclasses import dataclass

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import set_span_in_context

from tokenpath import attributes as A
from tokenpath.stages import Phase, Provenance, StageId

MODEL = "llama-3.1-8b-instruct"
BLOCK_TOKENS = 16
SYSTEM_PROMPTS = 3
SPREAD_SECONDS = 300.0

# Stages the root span records as events: (stage, low seconds, high seconds).
ROOT_STAGES = (
    (StageId.CLIENT_TOKENIZE, 0.0004, 0.002),
    (StageId.API_GATEWAY, 0.001, 0.004),
    (StageId.AUTH_RATELIMIT, 0.0002, 0.001),
    (StageId.ROUTER, 0.0005, 0.002),
    (StageId.SWITCH_HOP, 0.0001, 0.0004),
    (StageId.NIC_TX, 0.0002, 0.001),
    (StageId.ETHERNET_SERIALIZE, 0.001, 0.006),
    (StageId.RESPONSE_PATH, 0.004, 0.02),
    (StageId.CLIENT_DECODE, 0.0005, 0.003),
)


@dataclass(frozen=True, slots=True)
class SentRequest:
    trace_id: str
    input_tokens: int
    cached_tokens: int
    output_tokens: int


def _fingerprint(*parts: object) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()[:16]


def send_workload(otlp_http_url: str, count: int = 40, seed: int = 11,
                  headers: dict[str, str] | None = None) -> list[SentRequest]:
    """Emit ``count`` requests to ``{otlp_http_url}/v1/traces``; returns what was sent."""
    rng = random.Random(seed)
    provider = TracerProvider(resource=Resource.create({
        A.NODE: "gpu-node-1", A.POOL: "pool-a", "service.name": "tokenpath-ui-test"}))
    exporter = OTLPSpanExporter(endpoint=f"{otlp_http_url}/v1/traces", headers=headers or {})
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracer = provider.get_tracer("tokenpath-ui-test")
    now = time.time()
    seen_prompts: set[int] = set()
    sent = []
    for i in range(count):
        family = rng.randrange(SYSTEM_PROMPTS)
        system_blocks = (40, 120, 600)[family]
        user_blocks = rng.choice((8, 20, 60, 300))
        input_tokens = (system_blocks + user_blocks) * BLOCK_TOKENS - rng.randrange(BLOCK_TOKENS)
        # The cache warms up over the run: later requests hit more often.
        hit = family in seen_prompts and rng.random() < 0.25 + 0.7 * i / count
        cached = system_blocks * BLOCK_TOKENS if hit else 0
        seen_prompts.add(family)
        output_tokens = rng.randint(40, 400)
        fingerprints = [_fingerprint("system", family, b) for b in range(system_blocks)]
        fingerprints += [_fingerprint("user", i, b) for b in range(user_blocks)]
        queue = rng.uniform(0.002, 0.05)
        prefill = 2e-5 * (input_tokens - cached) + 0.004
        decode = output_tokens * rng.uniform(0.008, 0.014)
        ttft = queue + prefill + 0.01
        chunks = output_tokens
        start = now - SPREAD_SECONDS + SPREAD_SECONDS * i / count
        start_ns = int(start * 1e9)
        end_ns = int((start + ttft + decode + 0.03) * 1e9)
        root = tracer.start_span("chat completion", start_time=start_ns)
        root.set_attributes({
            A.GEN_AI_REQUEST_MODEL: MODEL,
            A.GEN_AI_USAGE_INPUT_TOKENS: input_tokens,
            A.GEN_AI_USAGE_OUTPUT_TOKENS: output_tokens,
            A.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: cached,
            A.TTFT_SECONDS: ttft,
            A.PREFIX_FINGERPRINTS: fingerprints,
            A.RESPONSE_BYTES: chunks * rng.randint(60, 90),
            A.RESPONSE_CHUNKS: chunks,
            A.RESPONSE_SMALL_CHUNKS: int(chunks * rng.uniform(0.6, 0.95)),
        })
        for stage, low, high in ROOT_STAGES:
            root.add_event(A.STAGE_EVENT, {A.STAGE: stage.value,
                                           A.STAGE_SECONDS: rng.uniform(low, high)})
        engine = tracer.start_span(A.VLLM_REQUEST_SPAN_NAME, context=set_span_in_context(root),
                                   start_time=start_ns + int(0.005e9))
        engine.set_attributes({
            A.VLLM_USAGE_PROMPT_TOKENS: input_tokens,
            A.VLLM_USAGE_COMPLETION_TOKENS: output_tokens,
            A.VLLM_LATENCY_TIME_IN_QUEUE: queue,
            A.VLLM_LATENCY_TIME_IN_MODEL_PREFILL: prefill,
            A.VLLM_LATENCY_TIME_IN_MODEL_DECODE: decode,
            A.VLLM_LATENCY_TIME_TO_FIRST_TOKEN: ttft,
            A.GPU_TYPE: "H100-SXM",
            A.TENSOR_PARALLEL: 2,
            A.ENGINE: "vllm",
        })
        engine.add_event(A.STAGE_EVENT, {A.STAGE: StageId.KV_CACHE_LOOKUP.value,
                                         A.STAGE_SECONDS: rng.uniform(0.0001, 0.0008)})
        for phase, share in ((Phase.PREFILL, 0.05), (Phase.DECODE, 0.04)):
            in_model = prefill if phase is Phase.PREFILL else decode
            engine.add_event(A.STAGE_EVENT, {A.STAGE: StageId.GPU_DISPATCH.value,
                                             A.PHASE: phase.value,
                                             A.STAGE_SECONDS: in_model * share})
        engine.add_event(A.STAGE_EVENT, {A.STAGE: StageId.NVLINK.value,
                                         A.PHASE: Phase.DECODE.value,
                                         A.PROVENANCE: Provenance.MODELED.value,
                                         A.STAGE_SECONDS: decode * 0.03})
        engine.end(end_time=end_ns - int(0.02e9))
        root.end(end_time=end_ns)
        sent.append(SentRequest(format(root.get_span_context().trace_id, "032x"),
                                input_tokens, cached, output_tokens))
    assert provider.force_flush(30_000)
    provider.shutdown()
    return sent
