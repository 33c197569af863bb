"""One request served by two engines: prefill on one, decode on another (P/D).

vLLM behind a P/D proxy (its KV connectors), llm-d's P/D disaggregation, NVIDIA Dynamo's
disaggregated workers and SGLang's PD mode each leave two engine spans of one request id
in the call (collector/calls.py merges them). The record is one, with both engines named:

- roles: an engine span that says its role (``tokenpath.engine.role``, Dynamo's
  ``disagg_role``, SGLang's ``prefill ``/``decode `` request span name) is taken at its
  word; otherwise the engine whose span ends last ran the decode, and the other engine's
  spans (at most one output token each, ended before it, not failed) ran the prefill;
- the record's ``node`` and ``engine_id`` are the decode engine's (the response came from
  it); ``prefill_node``/``prefill_engine_id`` and ``decode_node``/``decode_engine_id``
  name both, each read from that engine's own spans (never one key from each engine);
- prompt and cached tokens are the prefill engine's (it computed the prompt), output
  tokens and decode time the decode engine's;
- scheduler_queue is the prefill engine's queue wait; the decode engine's wait is the
  KV transfer (vLLM schedules the request once its KV has arrived), on ``nvlink`` when
  both engines are on one node, else on ``nic_tx``, in the ``kv_transfer`` phase
  (derived), unless an engine timed the transfer itself (SGLang's
  ``prefill_transfer_kv_cache``, measured);
- the tokens transferred: ``tokenpath.kv_transfer.tokens`` where a proxy shim relayed the
  ``kv_transfer_params`` (``relayed``), else derived from the spans (``derived``): the
  prompt, less the last token for vLLM (its decode engine computes that one itself); the
  bytes are the tokens x the model's KV bytes per token (tokenpath/roofline.py catalog).
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenpath import attributes as A
from tokenpath.collector.cost.catalog import catalog_model_name
from tokenpath.collector.spans import STATUS_CODE_ERROR, SpanData, attribute_number
from tokenpath.collector.stack_vocabularies import (
    DYNAMO_DISAGG_ROLE,
    DYNAMO_ENGINE_SPAN,
    DYNAMO_INPUT_TOKENS,
    DYNAMO_OUTPUT_TOKENS,
    DYNAMO_TTFT_MS,
    SGLANG_MODULE_ATTRIBUTE,
    SGLANG_REQUEST_MODULE,
)
from tokenpath.identity import identity_from
from tokenpath.metric_names import LINK_NETWORK, LINK_NVLINK
from tokenpath.records import PhaseShare, RequestRecord, StageTiming
from tokenpath.roofline import MODELS
from tokenpath.stage_members import (
    DERIVED,
    KV_TRANSFER,
    NIC_TX,
    NVLINK,
    SCHEDULER_QUEUE,
)
from tokenpath.stages import NETWORK_STAGES, Provenance, StageId

ROLE_PREFILL = "prefill"
ROLE_DECODE = "decode"
ROLES = (ROLE_PREFILL, ROLE_DECODE)
KV_SOURCE_RELAYED = "relayed"
KV_SOURCE_DERIVED = "derived"
QUEUE_MATCH_SECONDS = 1e-9

_OUTPUT_KEYS = (A.GEN_AI_USAGE_OUTPUT_TOKENS, A.VLLM_USAGE_COMPLETION_TOKENS,
                DYNAMO_OUTPUT_TOKENS)
_INPUT_KEYS = (A.GEN_AI_USAGE_INPUT_TOKENS, A.VLLM_USAGE_PROMPT_TOKENS, DYNAMO_INPUT_TOKENS)
_CACHED_KEYS = (A.CACHED_TOKENS, A.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
                A.GEN_AI_USAGE_CACHED_TOKENS)


@dataclass(slots=True)
class Roles:
    """The engine spans of a disaggregated request, by the part each engine ran."""

    prefill: list[SpanData]
    decode: list[SpanData]


def engine_role(span: SpanData) -> str | None:
    """The role an engine span states: tokenpath's attribute, Dynamo's ``disagg_role``,
    SGLang's request span name (``prefill Req ...``, ``decode Req ...``); None when it
    states none (or "agg")."""
    attributes = span.attributes
    for key in (A.ENGINE_ROLE, DYNAMO_DISAGG_ROLE):
        value = attributes.get(key)
        if value in ROLES:
            return str(value)
    if attributes.get(SGLANG_MODULE_ATTRIBUTE) == SGLANG_REQUEST_MODULE:
        head = span.name.split(" ", 1)[0]
        if head in ROLES:
            return head
    return None


def _count(spans: list[SpanData], keys: tuple[str, ...]) -> int | None:
    for span in spans:
        for key in keys:
            number = attribute_number(span.attributes.get(key))
            if number is not None:
                return max(0, int(number))
    return None


def _identity_key(span: SpanData) -> tuple[str | None, str | None]:
    identity = identity_from([span.attributes, span.resource])
    return identity.node, identity.engine


# clocks of the prefill and the decode engine's hosts may disagree by this much
HOST_SKEW_NANOS = 5_000_000


def split_roles(engine_spans: list[SpanData]) -> Roles | None:
    """The prefill and decode engines' spans; None when one engine served the call."""
    if len(engine_spans) < 2:
        return None
    roles = [engine_role(s) for s in engine_spans]
    if any(role is not None for role in roles):
        prefill = [s for s, r in zip(engine_spans, roles, strict=True) if r == ROLE_PREFILL]
        decode = [s for s, r in zip(engine_spans, roles, strict=True) if r != ROLE_PREFILL]
        return Roles(prefill, decode) if prefill and decode else None
    last = max(engine_spans, key=lambda s: s.end_unix_nano)
    decoder = _identity_key(last)
    # A prefill is over before its decode is scheduled (the decode engine waits for the
    # KV in its queue): spans of one engine that overlap, as an engine's own hook span
    # and its llm_request span of one request do, are never a prefill and its decode.
    scheduled = last.start_unix_nano + int(
        (_seconds(last, A.VLLM_LATENCY_TIME_IN_QUEUE) or 0.0) * 1e9) + HOST_SKEW_NANOS
    prefill = [s for s in engine_spans
               if s is not last and s.end_unix_nano <= scheduled
               and s.status_code != STATUS_CODE_ERROR
               and (_count([s], _OUTPUT_KEYS) or 0) <= 1
               and (_identity_key(s) != decoder or decoder == (None, None))]
    if not prefill:
        return None
    chosen = {id(s) for s in prefill}
    return Roles(prefill, [s for s in engine_spans if id(s) not in chosen])


def kv_bytes_per_token(model: str) -> float | None:
    """The model's KV cache bytes per token (all layers), None when not in the catalog."""
    name = catalog_model_name(model)
    return None if name is None else MODELS[name].kv_bytes_per_token


def _seconds(span: SpanData, key: str) -> float | None:
    number = attribute_number(span.attributes.get(key))
    return None if number is None else max(0.0, number)


def _in_model(spans: list[SpanData]) -> tuple[float, float, float | None]:
    """Prefill and decode in-model seconds and the queue wait (None: not said) of one
    engine's spans."""
    prefill = decode = 0.0
    queue: float | None = None
    for span in spans:
        p = _seconds(span, A.VLLM_LATENCY_TIME_IN_MODEL_PREFILL)
        d = _seconds(span, A.VLLM_LATENCY_TIME_IN_MODEL_DECODE)
        ttft_ms = _seconds(span, DYNAMO_TTFT_MS) if span.name == DYNAMO_ENGINE_SPAN else None
        if p is None and d is None and ttft_ms is not None:
            p = min(span.duration_seconds, ttft_ms / 1000.0)
            d = span.duration_seconds - p
        prefill += p or 0.0
        decode += d or 0.0
        q = _seconds(span, A.VLLM_LATENCY_TIME_IN_QUEUE)
        if q is not None:
            queue = (queue or 0.0) + q
    return prefill, decode, queue


def _add(stages: dict[StageId, StageTiming], stage: StageId, seconds: float,
         provenance: Provenance) -> None:
    timing = stages.get(stage)
    if timing is None:
        timing = stages[stage] = StageTiming(stage, 0.0, provenance)
    timing.seconds += seconds
    share = timing.phases.get(KV_TRANSFER)
    if share is None:
        timing.phases[KV_TRANSFER] = PhaseShare(seconds)
    else:
        share.seconds += seconds


def has_timed_transfer(stages: dict[StageId, StageTiming]) -> bool:
    return any(KV_TRANSFER in stages[s].phases for s in (NVLINK, *NETWORK_STAGES)
               if s in stages)


def kv_link(record: RequestRecord) -> str:
    """``nvlink`` when both engines are on one known node, else ``network``."""
    same = record.prefill_node is not None and record.prefill_node == record.decode_node
    return LINK_NVLINK if same else LINK_NETWORK


def disaggregate(record: RequestRecord, stages: dict[StageId, StageTiming],
                 engine_spans: list[SpanData], call_spans: list[SpanData]) -> Roles | None:
    """Rewrites a mapped record of a disaggregated request (the module's rules); None, and
    nothing changed, when one engine served it. Call after the engine's times are mapped
    and before the GPU time is split into stages."""
    roles = split_roles(engine_spans)
    if roles is None:
        return None
    prefill_id = identity_from([*(s.attributes for s in roles.prefill),
                                *(s.resource for s in roles.prefill)])
    decode_id = identity_from([*(s.attributes for s in roles.decode),
                               *(s.resource for s in roles.decode)])
    record.prefill_node, record.prefill_engine_id = prefill_id.node, prefill_id.engine
    record.decode_node, record.decode_engine_id = decode_id.node, decode_id.engine
    record.node, record.engine_id = decode_id.node, decode_id.engine
    prompt = _count(roles.prefill, _INPUT_KEYS)
    if prompt is not None:
        record.input_tokens = prompt
    cached = _count(roles.prefill, _CACHED_KEYS)
    if cached is not None:
        record.cache_read_tokens = min(record.input_tokens, cached)
    output = _count(roles.decode, _OUTPUT_KEYS)
    if output is not None:
        record.output_tokens = output
    p_prefill, _, p_queue = _in_model(roles.prefill)
    _, d_decode, d_queue = _in_model(roles.decode)
    prefill_end = max(s.end_unix_nano for s in roles.prefill) / 1e9
    decode_end = max(s.end_unix_nano for s in roles.decode) / 1e9
    record.prefill_seconds = p_prefill
    record.decode_seconds = d_decode
    record.queue_seconds = p_queue
    record.engine_end_unix = decode_end
    record.decode_start_unix = decode_end - d_decode
    record.prefill_start_unix = min(prefill_end, record.decode_start_unix) - p_prefill
    queue = stages.get(SCHEDULER_QUEUE)
    if (queue is not None and d_queue is not None
            and abs(queue.seconds - (p_queue or 0.0) - d_queue) <= QUEUE_MATCH_SECONDS):
        # the engines' queue waits summed (no shim or slice timed the queue itself): the
        # decode engine's wait is the transfer's, not queueing
        queue.seconds = p_queue or 0.0
    relayed = next((attribute_number(s.attributes.get(A.KV_TRANSFER_TOKENS))
                    for s in call_spans if A.KV_TRANSFER_TOKENS in s.attributes), None)
    if relayed is not None:
        tokens, record.kv_transfer_source = int(max(0.0, relayed)), KV_SOURCE_RELAYED
    else:
        whole = record.engine != "vllm"  # vLLM's decode engine computes the last token
        tokens = record.input_tokens if whole else max(0, record.input_tokens - 1)
        record.kv_transfer_source = KV_SOURCE_DERIVED
    record.kv_transfer_tokens = min(tokens, record.input_tokens)
    per_token = kv_bytes_per_token(record.model)
    record.kv_transfer_bytes = round(record.kv_transfer_tokens * (per_token or 0.0))
    if not has_timed_transfer(stages) and d_queue is not None:
        link = NVLINK if kv_link(record) == LINK_NVLINK else NIC_TX
        _add(stages, link, d_queue, DERIVED)
    return roles

