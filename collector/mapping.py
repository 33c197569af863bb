"""Maps an assembled trace onto the 15 stages: one RequestRecord per request.

The rules are the contract of docs/architecture.md ("How spans become stages"):

1. A span carrying ``tokenpath.stage`` times that stage with its duration.
2. A span event ``tokenpath.stage`` carrying ``tokenpath.stage`` and
   ``tokenpath.stage.seconds`` times that stage (the cheap hook API).
3. vLLM's native ``llm_request`` span gives scheduler_queue (``time_in_queue``), the
   prefill and decode in-model times, the engine TTFT and the token counts.
4. A plain OpenTelemetry HTTP SERVER span (FastAPI/ASGI) gives api_gateway: its duration
   less the engine spans under it (derived), unless a shim recorded api_gateway itself.
5. GPU stages 7-10 split the measured in-model time and never add to it: gpu_dispatch
   as the engine hook measured it; the rest of prefill to kernel_exec and the rest of
   decode to hbm_load (modeled). The cost attributor refines this split with the roofline.

Traces with none of these (vLLM's startup spans, unrelated services) are not requests.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from operator import attrgetter

from tokenpath import attributes as A
from tokenpath import metric_names as M
from tokenpath.collector.assembler import AssembledTrace
from tokenpath.collector.call_join import HOP_CLIENT, HOP_PROXY, add_client_gaps
from tokenpath.collector.calls import (
    has_gen_ai,
    is_call_span,
    is_client_call_span,
    is_engine_span,
    is_http_server,
    split_calls,
)
from tokenpath.collector.disaggregated import disaggregate
from tokenpath.collector.engine_steps import EngineStepsTelemetry, is_engine_steps_span
from tokenpath.collector.interfaces import RecordConsumer
from tokenpath.collector.spans import (
    STATUS_CODE_ERROR,
    AttrValue,
    SpanData,
    attribute_number,
)
from tokenpath.collector.stack_vocabularies import (
    DYNAMO_ENGINE_SPAN,
    DYNAMO_INPUT_TOKENS,
    DYNAMO_MODEL,
    DYNAMO_OUTPUT_TOKENS,
    DYNAMO_TTFT_MS,
    KV_TRANSFER_SPANS,
    LITELLM_SERVICE_SPANS,
    LLMD_PREFIX_SCORER_SPAN,
    LLMD_SCORE_MAX,
    NAMED_STAGE_SPANS,
    SGLANG_MODULE_ATTRIBUTE,
    SGLANG_REQUEST_MODULE,
    UPSTREAM_SPAN_NAMES,
)
from tokenpath.collector.stats import CollectorStats
from tokenpath.identity import ENGINE_KEYS, NODE_KEYS, identity_from
from tokenpath.records import (
    CACHE_SOURCE_CLIENT,
    CACHE_SOURCE_ENGINE,
    CACHE_SOURCE_GATEWAY,
    PhaseShare,
    RequestRecord,
    StageTiming,
)
from tokenpath.slo import SloConfig, classify_record
from tokenpath.stage_members import (
    API_GATEWAY,
    AUTH_RATELIMIT,
    DECODE,
    DERIVED,
    GPU_DISPATCH,
    HBM_LOAD,
    KERNEL_EXEC,
    KV_TRANSFER,
    MEASURED,
    MODELED,
    PREFILL,
    ROUTER,
    SCHEDULER_QUEUE,
)
from tokenpath.stages import (
    PHASE_BY_VALUE,
    PROVENANCE_BY_VALUE,
    PROVENANCE_RANK,
    STAGE_BY_VALUE,
    Phase,
    Provenance,
    StageId,
)

log = logging.getLogger(__name__)

UNKNOWN_MODEL = M.UNKNOWN
# The largest token or byte count a record takes from an attribute (a signed 64-bit
# integer, as OTLP's int_value and the store's JSON encoder hold).
MAX_COUNT = 2**63 - 1
ERROR_STATUS = "error"
CLIENT_ERROR_STATUS = "client_error"


def capped_count(number: float) -> int:
    """A count from a finite number: at least 0, at most MAX_COUNT (a garbled ``1e300``).
    Compared, not ``min``-ed: ``min(1e300, MAX_COUNT)`` is the int in Python but the
    float 2**63 where the comparison runs in floats (compiled code)."""
    if number >= MAX_COUNT:
        return MAX_COUNT
    return int(number) if number > 0 else 0
OK_STATUS = "ok"


def _seconds(value: AttrValue | None) -> float | None:
    """A duration attribute; negative or non-finite values (skew, bugs) become 0."""
    f = attribute_number(value)
    return None if f is None else max(0.0, f)


class _Lookup:
    """First value of an attribute across a trace, in a preferred span order.

    The layers are merged once, the first layer's value winning, so each lookup is one
    dict read however many spans the trace has (attribute values are never None)."""

    def __init__(self, layers: list[dict[str, AttrValue]]) -> None:
        merged: dict[str, AttrValue] = {}
        for layer in reversed(layers):
            merged.update(layer)
        self._merged = merged

    def get(self, *keys: str) -> AttrValue | None:
        merged = self._merged
        for key in keys:
            value = merged.get(key)
            if value is not None:
                return value
        return None

    def text(self, *keys: str) -> str | None:
        value = self.get(*keys)
        return None if value is None else str(value)

    def count(self, *keys: str) -> int | None:
        """A non-negative count, at most MAX_COUNT (a garbled ``1e300`` token count)."""
        f = attribute_number(self.get(*keys))
        return None if f is None else capped_count(f)


class _StageAccumulator:
    def __init__(self) -> None:
        self.stages: dict[StageId, StageTiming] = {}

    def add(self, stage: StageId, seconds: float, provenance: Provenance,
            phase: Phase | None = None) -> None:
        if seconds < 0.0:
            seconds = 0.0
        timing = self.stages.get(stage)
        if timing is None:
            timing = self.stages[stage] = StageTiming(stage, seconds, provenance)
        else:
            if PROVENANCE_RANK[provenance] > PROVENANCE_RANK[timing.provenance]:
                timing.provenance = provenance  # a sum is only as good as its weakest part
            timing.seconds += seconds
        if phase is not None:
            share = timing.phases.get(phase)
            if share is None:
                timing.phases[phase] = PhaseShare(seconds)
            else:
                share.seconds += seconds

    def phase_seconds(self, stage: StageId, phase: Phase) -> float:
        timing = self.stages.get(stage)
        if timing is None:
            return 0.0
        share = timing.phases.get(phase)
        return share.seconds if share else 0.0




def _route_class(spans: list[SpanData]) -> str:
    """A bounded label for an HTTP call that was not an LLM call."""
    for span in spans:
        code = attribute_number(span.attributes.get(A.HTTP_RESPONSE_STATUS_CODE,
                                        span.attributes.get(A.HTTP_STATUS_CODE_OLD)))
        if code is not None and code >= 400:
            return f"{int(code) // 100}xx"
    return "other_route"


def _http_status(spans: list[SpanData]) -> str | None:
    """From the outermost server span's HTTP status code: 5xx error, 4xx client_error."""
    for span in spans:
        code = attribute_number(span.attributes.get(A.HTTP_RESPONSE_STATUS_CODE,
                                        span.attributes.get(A.HTTP_STATUS_CODE_OLD)))
        if code is not None:
            if code >= 500:
                return ERROR_STATUS
            if code >= 400:
                return CLIENT_ERROR_STATUS
            return OK_STATUS
    return None


def _first_count(layers: list[dict[str, AttrValue]], *keys: str) -> int | None:
    """A count from the first layer (span) that has any of ``keys``: the span nearest the
    engine wins, then the key order (a client's gen_ai.usage.input_tokens never overrides
    the engine's prompt_tokens)."""
    for layer in layers:
        for key in keys:
            value = layer.get(key)
            if value is not None:
                f = attribute_number(value)
                if f is not None:
                    return capped_count(f)
    return None


_START = attrgetter("start_unix_nano")
_END = attrgetter("end_unix_nano")
_INF = float("inf")


def map_trace(trace: AssembledTrace, slo: SloConfig | None = None) -> RequestRecord | None:
    """The request record of a trace, or None when the trace is not a request; with
    ``slo`` classes, classified (tokenpath/slo.py: its class, outcome, dominant stage)."""
    spans = sorted(trace.spans, key=_START)
    engine_spans = [s for s in spans if is_engine_span(s)]
    server_spans = [s for s in spans if is_http_server(s)]
    upstream = _outermost_upstream(spans)
    acc = _stage_times(spans, upstream)
    if not engine_spans and not acc.stages and not any(is_call_span(s) for s in spans) and not (
            server_spans and any(has_gen_ai(s) for s in spans)):
        return None  # not an LLM call: startup spans, health checks, docs pages

    roots = [s for s in spans if s.is_root]
    layers: list[dict[str, AttrValue]] = list(trace.annotations)
    for span in (*engine_spans, *roots, *spans):
        layers.append(span.attributes)
    for span in spans[:1]:
        layers.append(span.resource)
    look = _Lookup(layers)
    client_spans = [s for s in spans if is_client_call_span(s)]

    record = RequestRecord(trace_id=trace.trace_id, complete=trace.complete)
    record.span_count = len(spans)
    record.start_unix = spans[0].start_unix_nano / 1e9
    record.end_unix = max(s.end_unix_nano for s in spans) / 1e9
    record.model = _model(trace.annotations, engine_spans, server_spans, client_spans, look)
    record.request_id = look.text(A.GEN_AI_REQUEST_ID)
    _map_identity(record, trace, look, engine_spans)
    token_layers = _map_tokens(record, trace, spans, engine_spans, server_spans)
    record.response_id = _first_text(token_layers, A.GEN_AI_RESPONSE_ID)
    record.outer_hop = _outer_hop(spans, engine_spans, server_spans, upstream)
    if record.outer_hop == HOP_CLIENT:
        client_span = client_spans[0]
        record.client_start_unix = client_span.start_unix_nano / 1e9
        record.client_end_unix = client_span.end_unix_nano / 1e9
    outer_sends = trace.body_sends.get(server_spans[0].span_id) if server_spans else None
    _map_response(record, look, outer_sends)
    status = look.text(A.STATUS)
    if status is None and any(s.status_code == STATUS_CODE_ERROR for s in roots):
        status = ERROR_STATUS
    if status is None:
        status = _http_status(server_spans) or OK_STATUS
    record.status = status

    _map_engine(record, acc, engine_spans)
    roles = disaggregate(record, acc.stages, engine_spans, spans) if len(engine_spans) > 1 else None
    _map_gateway(acc, upstream, server_spans, engine_spans)
    _map_client_gaps(acc, client_spans, server_spans, engine_spans)
    _split_gpu_time(record, acc)
    ttft = _ttft(look, spans, server_spans, engine_spans if roles is None else [], outer_sends)
    if ttft is None and roles is not None and record.decode_start_unix is not None:
        ttft = max(0.0, record.decode_start_unix - record.start_unix)  # P, transfer, D
    record.ttft_seconds = ttft
    if record.output_tokens > 1:
        if record.decode_seconds is not None:
            record.tpot_seconds = record.decode_seconds / (record.output_tokens - 1)
        elif ttft is not None:
            record.tpot_seconds = max(0.0, record.duration_seconds - ttft) / (
                record.output_tokens - 1
            )
    record.stages = acc.stages
    if slo is not None and slo.classes:
        classify_record(record, slo, look.text)
    return record


def _stage_times(spans: list[SpanData], upstream: list[SpanData]) -> _StageAccumulator:
    """Each span's stage (its stage attribute, else its name) and each stage event's.

    The loop runs for every span and event of every trace: the lookups it repeats are bound
    to locals once (a local read is cheaper than a global or attribute read, compiled or
    not), and a float duration, the common case, skips the general parse."""
    acc = _StageAccumulator()
    add = acc.add
    stage_of = STAGE_BY_VALUE.get
    phase_of = PHASE_BY_VALUE.get
    provenance_of = PROVENANCE_BY_VALUE.get
    measured = MEASURED
    stage_event = A.STAGE_EVENT
    for span in spans:
        attributes = span.attributes
        stage = stage_of(attributes.get(A.STAGE))
        phase = phase_of(attributes.get(A.PHASE))
        named = stage is None and span.name in NAMED_STAGE_SPANS
        if named:
            stage = NAMED_STAGE_SPANS[span.name]
        elif stage is None and span.name in KV_TRANSFER_SPANS:  # P/D: the KV on the wire
            stage, phase = KV_TRANSFER_SPANS[span.name], KV_TRANSFER
        if stage is not None:  # decoding keeps end >= start; add() clamps at 0 anyway
            seconds = (span.end_unix_nano - span.start_unix_nano) / 1e9
            if named and upstream and span.name in LITELLM_SERVICE_SPANS:
                seconds -= _overlap_seconds(span, upstream)  # its router span holds the call
            add(stage, seconds, provenance_of(attributes.get(A.PROVENANCE), measured), phase)
        for event in span.events:
            if event.name != stage_event:
                continue
            ev_attributes = event.attributes
            value = ev_attributes.get(A.STAGE)
            ev_stage = stage_of(value) if isinstance(value, str) else None
            if ev_stage is None:
                continue
            value = ev_attributes.get(A.STAGE_SECONDS)
            if value.__class__ is float and 0.0 < value < _INF:  # the common case
                ev_seconds = float(value)
            else:  # ints, strings, negatives and non-finite values: as for any duration
                parsed = _seconds(value)
                if parsed is None:
                    continue
                ev_seconds = parsed
            value = ev_attributes.get(A.PROVENANCE)
            ev_provenance = provenance_of(value, measured) if isinstance(value, str) else measured
            value = ev_attributes.get(A.PHASE)
            add(ev_stage, ev_seconds, ev_provenance,
                phase_of(value) if isinstance(value, str) else None)
    return acc


def _map_identity(record: RequestRecord, trace: AssembledTrace, look: _Lookup,
                  engine_spans: list[SpanData]) -> None:
    """Where the request ran: node, engine, pool, tenant, GPU type and parallelism."""
    if engine_spans:  # the engine's own spans name its GPUs, never the gateway's host;
        # one engine's (the one that answered: its span ends last), never a key from each
        last = max(engine_spans, key=_END)
        identity = identity_from([*trace.annotations, last.attributes, last.resource])
        record.node, record.engine_id = identity.node, identity.engine
    else:
        record.node, record.engine_id = look.text(*NODE_KEYS), look.text(*ENGINE_KEYS)
    record.pool = look.text(A.POOL)
    record.tenant = look.text(A.TENANT)
    record.engine = look.text(A.ENGINE) or (_engine_kind(engine_spans[0]) if engine_spans
                                            else None)
    record.gpu_type = look.text(A.GPU_TYPE)
    record.tensor_parallel = look.count(A.TENSOR_PARALLEL) or 1
    record.simulated = look.get(A.SIMULATED) is True


def _map_tokens(record: RequestRecord, trace: AssembledTrace, spans: list[SpanData],
                engine_spans: list[SpanData],
                server_spans: list[SpanData]) -> list[dict[str, AttrValue]]:
    """Input, output and cached tokens and the router's predicted hit; returns the layers
    read, nearest the engine first, for the other fields the engine reports best."""
    # Tokens: engine > gateway > client (by span, then by key): annotations and engine
    # spans, then server spans, then the rest nearest the engine first (latest start).
    token_layers: list[dict[str, AttrValue]] = [
        *trace.annotations, *(s.attributes for s in engine_spans),
        *(s.attributes for s in server_spans), *(s.attributes for s in reversed(spans))]
    record.input_tokens = _first_count(token_layers, A.GEN_AI_USAGE_INPUT_TOKENS,
                                       A.VLLM_USAGE_PROMPT_TOKENS,
                                       A.OPENINFERENCE_PROMPT_TOKENS) or _first_count(
        [s.attributes for s in engine_spans], DYNAMO_INPUT_TOKENS) or 0
    record.output_tokens = _first_count(token_layers, A.GEN_AI_USAGE_OUTPUT_TOKENS,
                                        A.VLLM_USAGE_COMPLETION_TOKENS,
                                        A.OPENINFERENCE_COMPLETION_TOKENS) or _first_count(
        [s.attributes for s in engine_spans], DYNAMO_OUTPUT_TOKENS) or 0
    cached, record.cache_read_source = _cached_tokens(trace.annotations, engine_spans,
                                                      server_spans, spans)
    record.cache_read_tokens = min(record.input_tokens, cached)
    scored = next((attribute_number(s.attributes.get(LLMD_SCORE_MAX)) for s in spans
                   if s.name == LLMD_PREFIX_SCORER_SPAN), None)
    if scored is not None:
        record.router_predicted_cache_hit = min(1.0, max(0.0, scored))
    return token_layers


def _map_response(record: RequestRecord, look: _Lookup,
                  outer_sends: tuple[int, int] | None) -> None:
    """The response's shape on the wire: bytes, chunks, packets, prefix fingerprints."""
    record.response_bytes = look.count(A.RESPONSE_BYTES) or 0
    record.response_chunks = look.count(A.RESPONSE_CHUNKS) or 0
    if outer_sends is not None and not record.response_chunks:
        record.response_chunks = outer_sends[0]  # the ASGI body sends folded on ingest
    record.small_chunks = look.count(A.RESPONSE_SMALL_CHUNKS) or 0
    record.response_packets = look.count(A.RESPONSE_PACKETS) or 0
    fingerprints = look.get(A.PREFIX_FINGERPRINTS)
    if isinstance(fingerprints, tuple):
        record.prefix_fingerprints = tuple(str(f) for f in fingerprints)
        record.prefix_block_tokens = look.count(A.PREFIX_BLOCK_TOKENS) or 0


def _map_client_gaps(acc: _StageAccumulator, client_spans: list[SpanData],
                     server_spans: list[SpanData], engine_spans: list[SpanData]) -> None:
    """A GenAI client span around the serving side (the outermost gateway, else the engine
    it called directly: OpenLIT's client propagates to vLLM) adds the client's own time
    before and after it; a gateway's own upstream client span is not around it."""
    serving = server_spans[:1] or engine_spans
    if not client_spans or not serving:
        return
    client = client_spans[0]
    serving_start = min(s.start_unix_nano for s in serving)
    serving_end = max(s.end_unix_nano for s in serving)
    if client.start_unix_nano <= serving_start and client.end_unix_nano >= serving_end:
        add_client_gaps(acc.stages, client.start_unix_nano / 1e9,
                        client.end_unix_nano / 1e9, serving_start / 1e9, serving_end / 1e9)


def _ttft(look: _Lookup, spans: list[SpanData], server_spans: list[SpanData],
          engine_spans: list[SpanData], outer_sends: tuple[int, int] | None) -> float | None:
    """TTFT as the user saw it: a shim's measurement, else a GenAI client span's first
    chunk, else the outer server's first body send, else the engine's."""
    ttft = _seconds(look.get(A.TTFT_SECONDS, A.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK))
    if ttft is None:
        ttft = _client_first_chunk(spans)
    if ttft is None and outer_sends is not None and outer_sends[0] > 1:
        # a streamed response's first body send, on the server's own clock (one send is
        # a whole response, not a first token)
        ttft = max(0.0, (outer_sends[1] - server_spans[0].start_unix_nano) / 1e9)
    if ttft is None and engine_spans:
        ttft = _seconds(engine_spans[0].attributes.get(A.VLLM_LATENCY_TIME_TO_FIRST_TOKEN))
    return ttft


def _map_engine(record: RequestRecord, acc: _StageAccumulator,
                engine_spans: list[SpanData]) -> None:
    if not engine_spans:
        return
    queue = prefill = decode = 0.0
    have_queue = have_prefill = have_decode = False
    for span in engine_spans:
        attrs = span.attributes
        q = _seconds(attrs.get(A.VLLM_LATENCY_TIME_IN_QUEUE))
        if q is not None:
            queue += q
            have_queue = True
        p = _seconds(attrs.get(A.VLLM_LATENCY_TIME_IN_MODEL_PREFILL))
        d = _seconds(attrs.get(A.VLLM_LATENCY_TIME_IN_MODEL_DECODE))
        ttft_ms = _seconds(attrs.get(DYNAMO_TTFT_MS)) if span.name == DYNAMO_ENGINE_SPAN else None
        if p is None and d is None and ttft_ms is not None:
            # Dynamo's worker span: first token ttft_ms after it began, then decode
            p = min(span.duration_seconds, ttft_ms / 1000.0)
            d = span.duration_seconds - p
        if p is not None:
            prefill += p
            have_prefill = True
        if d is not None:
            decode += d
            have_decode = True
    if have_queue:  # an engine that did not say is not a measured 0 s
        record.queue_seconds = queue
        if SCHEDULER_QUEUE not in acc.stages:
            acc.add(SCHEDULER_QUEUE, queue, MEASURED)
    if have_prefill:
        record.prefill_seconds = prefill
    if have_decode:
        record.decode_seconds = decode
    last = max(engine_spans, key=lambda s: s.end_unix_nano)
    end = last.end_unix_nano / 1e9
    record.engine_end_unix = end
    record.engine_start_unix = min(s.start_unix_nano for s in engine_spans) / 1e9
    step_counts = [attribute_number(s.attributes.get(A.STEP_COUNT)) for s in engine_spans]
    if any(v is not None for v in step_counts):
        record.engine_steps = capped_count(sum(max(0.0, v) for v in step_counts
                                               if v is not None))
    step_seconds = [_seconds(s.attributes.get(A.STEP_SECONDS)) for s in engine_spans]
    if any(v is not None for v in step_seconds):
        record.engine_step_seconds = sum(v for v in step_seconds if v is not None)
    record.decode_start_unix = end - decode
    record.prefill_start_unix = end - decode - prefill


def _map_gateway(acc: _StageAccumulator, upstream: list[SpanData],
                 server_spans: list[SpanData], engine_spans: Iterable[SpanData]) -> None:
    """api_gateway derived from the outermost gateway span: its time less what happened
    downstream of it (a proxy's upstream call, else the engines) and less the gateway
    stages timed on their own (auth, router)."""
    if API_GATEWAY in acc.stages or not server_spans:
        return
    outer = server_spans[0]
    inner = sum(s.duration_seconds for s in (upstream or engine_spans))
    timed = sum(acc.stages[s].seconds for s in (AUTH_RATELIMIT, ROUTER)
                if s in acc.stages)
    acc.add(API_GATEWAY, outer.duration_seconds - inner - timed, DERIVED)


def _outermost_upstream(spans: list[SpanData]) -> list[SpanData]:
    """A proxy's upstream calls (LiteLLM's litellm_request), the outermost of each."""
    upstream = [s for s in spans if s.name in UPSTREAM_SPAN_NAMES]
    ids = {s.span_id for s in upstream}
    return [s for s in upstream if s.parent_span_id not in ids]


def _overlap_seconds(span: SpanData, others: list[SpanData]) -> float:
    return sum(max(0, min(span.end_unix_nano, o.end_unix_nano)
                   - max(span.start_unix_nano, o.start_unix_nano)) for o in others) / 1e9


# Where a record's model is named, by key within each source (docs/vllm.md
# "Which model a record names"): the engine's (tokenpath's vLLM plugin annotates the
# served model name; Dynamo's span), the gateway's request (its server span's
# gen_ai.request.model, from the request body), the client's call span, any other span.
_MODEL_KEYS = (A.GEN_AI_REQUEST_MODEL, A.GEN_AI_RESPONSE_MODEL)
_ENGINE_MODEL_KEYS = (*_MODEL_KEYS, DYNAMO_MODEL)
_CLIENT_MODEL_KEYS = (*_MODEL_KEYS, A.OPENINFERENCE_MODEL_NAME)
_CACHED_KEYS = (A.CACHED_TOKENS, A.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
                A.GEN_AI_USAGE_CACHED_TOKENS, A.OPENINFERENCE_CACHE_READ_TOKENS)
_FIRST_CHUNK_EVENTS = frozenset({A.OPENLLMETRY_CHUNK_EVENT, A.OPENINFERENCE_FIRST_TOKEN_EVENT})


def _model(annotations: list[dict[str, AttrValue]], engine_spans: list[SpanData],
           server_spans: list[SpanData], client_spans: list[SpanData],
           look: _Lookup) -> str:
    """The model a record names: the first source that names one, the engine first (what
    ran is what is priced), then the gateway, then the client, then any span; UNKNOWN_MODEL
    when none does. Within a source the keys in order (the requested model first)."""
    engine = [*annotations, *[s.attributes for s in engine_spans]]
    for layers, keys in ((engine, _ENGINE_MODEL_KEYS),
                         ([s.attributes for s in server_spans], _MODEL_KEYS),
                         ([s.attributes for s in client_spans], _CLIENT_MODEL_KEYS)):
        for key in keys:
            name = _first_text(layers, key)
            if name is not None:
                return name
    return look.text(*_CLIENT_MODEL_KEYS) or UNKNOWN_MODEL


def _cached_tokens(annotations: list[dict[str, AttrValue]], engine_spans: list[SpanData],
                   server_spans: list[SpanData],
                   spans: list[SpanData]) -> tuple[int, str | None]:
    """Prompt tokens read from the prefix cache and who said so: the engine's own count
    (tokenpath's vLLM plugin, an engine span) first, then the gateway's (the usage details
    of the response it relayed: vLLM's count as it returned it to the call), then any other
    span (a client's usage, nearest the engine first); (0, None) when none says."""
    engine = [*annotations, *[s.attributes for s in engine_spans]]
    for source, layers in (
            (CACHE_SOURCE_ENGINE, engine),
            (CACHE_SOURCE_GATEWAY, [s.attributes for s in server_spans]),
            (CACHE_SOURCE_CLIENT, [s.attributes for s in reversed(spans)])):
        count = _first_count(layers, *_CACHED_KEYS)
        if count is not None:
            return count, source
    return 0, None


def _first_text(layers: list[dict[str, AttrValue]], key: str) -> str | None:
    for layer in layers:
        value = layer.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def _outer_hop(spans: list[SpanData], engine_spans: list[SpanData],
               server_spans: list[SpanData], upstream_spans: list[SpanData]) -> str | None:
    """"proxy" for a proxy's record whose upstream call is traced apart (LiteLLM without
    a forwarded traceparent), "client" for a GenAI client span with nothing under it;
    None when the record holds its serving side (collector/call_join.py)."""
    if engine_spans:
        return None
    by_id = {s.span_id: s for s in spans}

    def has_server_under(ids: set[str]) -> bool:
        for server in server_spans:  # a server under it: the call was propagated
            parent, hops = by_id.get(server.parent_span_id), 0
            while parent is not None and hops < len(spans):
                if parent.span_id in ids:
                    return True
                parent, hops = by_id.get(parent.parent_span_id), hops + 1
        return False

    upstream = {s.span_id for s in upstream_spans}
    if upstream:
        return None if has_server_under(upstream) else HOP_PROXY
    # a GenAI client span with no server span under it, whatever app server is above it
    clients = {s.span_id for s in spans if is_client_call_span(s)}
    if clients and not has_server_under(clients):
        return HOP_CLIENT
    return None


def _client_first_chunk(spans: list[SpanData]) -> float | None:
    """Seconds from a GenAI client span's start to its first streamed chunk: its event
    (OpenLLMetry's per-chunk event, OpenInference's first-token event), else the client's
    own measure (OpenLIT's)."""
    for span in spans:
        if not is_client_call_span(span):
            continue
        for event in span.events:
            if event.name in _FIRST_CHUNK_EVENTS:
                return max(0.0, (event.time_unix_nano - span.start_unix_nano) / 1e9)
        measured = _seconds(span.attributes.get(A.OPENLIT_CLIENT_TTFT))
        if measured is not None:
            return measured
    return None


def _engine_kind(span: SpanData) -> str:
    if span.name == DYNAMO_ENGINE_SPAN:
        return "dynamo"
    if span.attributes.get(SGLANG_MODULE_ATTRIBUTE) == SGLANG_REQUEST_MODULE:
        return "sglang"
    return "vllm"


def _split_gpu_time(record: RequestRecord, acc: _StageAccumulator) -> None:
    """Default split of in-model time into GPU stages (refined by the cost attributor)."""
    explicit = {HBM_LOAD, KERNEL_EXEC} & acc.stages.keys()
    if explicit:
        return
    for phase, in_model, stage in (
        (PREFILL, record.prefill_seconds, KERNEL_EXEC),
        (DECODE, record.decode_seconds, HBM_LOAD),
    ):
        if in_model is None:
            continue
        dispatch = acc.phase_seconds(GPU_DISPATCH, phase)
        acc.add(stage, in_model - dispatch, MODELED, phase)


def map_calls(trace: AssembledTrace, slo: SloConfig | None = None) -> list[RequestRecord]:
    """A record per LLM call of the trace (collector/calls.py): the whole trace when it
    holds one call (or none, by the stage rules), else one per call, each with its own
    spans and annotations and a record id ``<trace id>-<span id of its top>`` (always so
    for a continued trace, whose earlier emission may hold the bare trace id).

    A record is complete when its trace's root was seen or when it holds its own call's
    span (engine, gateway or client): an agent's calls are whole long before the
    workflow's root span ends."""
    calls = split_calls(trace.spans, trace.continued)
    if calls is None:
        record = map_trace(trace, slo)
        if record is None:
            return []
        if trace.continued:
            record.record_id = f"{trace.trace_id}-{min(s.span_id for s in trace.spans)}"
        record.complete = trace.complete or any(is_call_span(s) for s in trace.spans)
        return [record]
    records: list[RequestRecord] = []
    for call in calls:
        ids = {s.attributes.get(A.GEN_AI_REQUEST_ID) for s in call.spans if is_engine_span(s)}
        annotations = [a for a in trace.annotations if a.get(A.GEN_AI_REQUEST_ID) in ids]
        record = map_trace(AssembledTrace(trace.trace_id, call.spans, True, annotations,
                                          body_sends=trace.body_sends), slo)
        if record is not None:
            record.record_id = f"{trace.trace_id}-{call.top.span_id}"
            records.append(record)
    return records


class StageMapper:
    """Pipeline component: assembled traces in, request records out."""

    def __init__(self, downstream: RecordConsumer, stats: CollectorStats | None = None,
                 slo: SloConfig | None = None) -> None:
        self._downstream = downstream
        self._stats = stats or CollectorStats()
        self._slo = slo
        self.engine_steps = EngineStepsTelemetry()

    def consume_trace(self, trace: AssembledTrace) -> None:
        if trace.spans and all(is_engine_steps_span(s) for s in trace.spans):
            for span in trace.spans:  # the vLLM plugin's interval summary: no request
                self.engine_steps.observe(span)
            return
        try:
            records = map_calls(trace, self._slo)
        except Exception:
            log.exception("mapping failed for trace %s", trace.trace_id)
            self._stats.spans_dropped.inc("mapping_error", len(trace.spans))
            return
        if not records:
            self._stats.spans_unmapped.inc(len(trace.spans))
            if any(is_http_server(s) for s in trace.spans):  # a health check, a docs page
                self._stats.http_calls_not_llm.inc(_route_class(trace.spans))
            return
        for record in records:
            self._downstream.consume_record(record)

    def shutdown(self) -> None:
        self._downstream.shutdown()
