"""Plain records the collector computes: one per request, stage timings with provenance.

No Prometheus, no store: sinks consume these. ``to_json``/``from_json`` give the JSON
shape of docs/reference.md (``tokenpath requests --format json``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tokenpath.metric_names import UNKNOWN
from tokenpath.stage_members import MEASURED
from tokenpath.stages import PLAIN_VALUES, STAGE_IDS, Phase, Provenance, StageId

# Who said how many prompt tokens came from the prefix cache (``cache_read_source``): the
# engine itself (tokenpath's vLLM plugin, an engine span), the gateway (the usage details
# of the engine's response as the gateway relayed it), or a client span's usage.
CACHE_SOURCE_ENGINE = "engine"
CACHE_SOURCE_GATEWAY = "gateway"
CACHE_SOURCE_CLIENT = "client"


# The classes built per record or per slice write their own ``__init__``
# (``init=False``): mypyc compiles a written one, while a dataclass's generated
# ``__init__`` runs as interpreted Python even in a compiled module (6 to 9 times slower a
# construction, docs/performance.md). A written one takes the fields its callers set, in
# field order, and starts accumulated state at zero; tests/core/test_compiled.py lists
# the classes and checks their ``__init__`` is compiled.
@dataclass(slots=True, init=False)
class PhaseShare:
    """The part of a GPU stage that belongs to one phase."""

    seconds: float
    cost_dollars: float

    def __init__(self, seconds: float = 0.0, cost_dollars: float = 0.0) -> None:
        self.seconds = seconds
        self.cost_dollars = cost_dollars


@dataclass(slots=True, init=False)
class StageTiming:
    """One stage of one request: how long, how much, and how we know."""

    stage: StageId
    seconds: float
    provenance: Provenance
    cost_dollars: float
    phases: dict[Phase, PhaseShare]

    def __init__(self, stage: StageId, seconds: float, provenance: Provenance,
                 cost_dollars: float = 0.0,
                 phases: dict[Phase, PhaseShare] | None = None) -> None:
        self.stage = stage
        self.seconds = seconds
        self.provenance = provenance
        self.cost_dollars = cost_dollars
        self.phases = {} if phases is None else phases

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "seconds": self.seconds,
            "cost_dollars": self.cost_dollars,
            "provenance": PLAIN_VALUES[self.provenance],
        }
        if self.phases:
            out["phases"] = {
                PLAIN_VALUES[phase]: {"seconds": share.seconds,
                                      "cost_dollars": share.cost_dollars}
                for phase, share in self.phases.items()
            }
        return out

    @classmethod
    def from_json(cls, stage: StageId, data: dict[str, Any]) -> StageTiming:
        phases = {
            Phase(name): PhaseShare(float(v.get("seconds") or 0.0),
                                    float(v.get("cost_dollars") or 0.0))
            for name, v in (data.get("phases") or {}).items()
        }
        return cls(
            stage=stage,
            seconds=float(data.get("seconds") or 0.0),
            provenance=Provenance(data.get("provenance", MEASURED.value)),
            cost_dollars=float(data.get("cost_dollars") or 0.0),
            phases=phases,
        )


@dataclass(slots=True, init=False)  # a written __init__ (above)
class RequestRecord:
    """Everything tokenpath knows about one request, joined from all its spans."""

    # --- generated from tokenpath/record_fields.py: do not edit by hand ---
    # 32 lowercase hex
    trace_id: str
    # Unique per record: the trace id for a trace with one LLM call, else
    # "<trace id>-<span id of the call's top span>" (a trace with N calls gives N records).
    record_id: str = ""
    model: str = UNKNOWN
    request_id: str | None = None
    status: str = "ok"
    node: str | None = None
    pool: str | None = None
    # Who it was for (tokenpath.tenant): the chargeback unit; None: unattributed.
    tenant: str | None = None
    # The engine's kind: "vllm", "simulated", ...
    engine: str | None = None
    # The engine (GPU set) on its node that served it (tokenpath.identity); with ``node``
    # it is the pricing unit.
    engine_id: str | None = None
    # True when its node's GPUs come from the price sheet's inventory; False when they
    # were assumed (its tensor-parallel GPUs of the default GPU type); None: not priced.
    gpu_inventory: bool | None = None
    gpu_type: str | None = None
    tensor_parallel: int = 1
    simulated: bool = False
    start_unix: float = 0.0
    end_unix: float = 0.0
    input_tokens: int = 0
    cache_read_tokens: int = 0
    output_tokens: int = 0
    ttft_seconds: float | None = None
    tpot_seconds: float | None = None
    queue_seconds: float | None = None
    prefill_seconds: float | None = None
    decode_seconds: float | None = None
    # Engine timeline (unix seconds), from the engine span: scheduled -> first token -> done.
    prefill_start_unix: float | None = None
    decode_start_unix: float | None = None
    engine_end_unix: float | None = None
    response_bytes: int = 0
    response_chunks: int = 0
    small_chunks: int = 0
    # TCP segments the response became (the gateway's estimate: ceil(bytes / MSS) per
    # write); 0 when no shim counted them.
    response_packets: int = 0
    prefix_fingerprints: tuple[str, ...] = ()
    # Tokens per fingerprinted block, as the engine sent it; 0 when it did not say (the
    # collector's cost.prefix_block_tokens applies).
    prefix_block_tokens: int = 0
    stages: dict[StageId, StageTiming] = field(default_factory=dict)
    cost_dollars: float = 0.0
    naive_cost_dollars: float = 0.0
    cache_miss_waste_dollars: float = 0.0
    complete: bool = True
    span_count: int = 0
    # When the engine span began (request arrival at the engine; vLLM's arrival_time).
    engine_start_unix: float | None = None
    # Sum of the engine steps the request took part in (tokenpath.engine.step_seconds).
    engine_step_seconds: float | None = None
    # How many engine steps it took part in, prefill and decode (tokenpath.engine.steps).
    engine_steps: int | None = None
    # The response id (gen_ai.response.id) that names the call on every hop.
    response_id: str | None = None
    # "client" or "proxy" for a record of a client or proxy hop with nothing of the
    # serving side under it (its own trace: collector/call_join.py); None otherwise.
    outer_hop: str | None = None
    # Traces of the same call joined into this record by response id.
    joined_trace_ids: tuple[str, ...] = ()
    # The GenAI client span of a client hop (unix seconds): what its gaps are taken from.
    client_start_unix: float | None = None
    client_end_unix: float | None = None
    # Prefill of fingerprinted prefix blocks computed instead of read from the cache, by
    # cause (tokenpath.leaks.MissCause values): tokens and their prefill dollars. The waste
    # causes sum to cache_miss_waste_dollars.
    miss_tokens: dict[str, int] = field(default_factory=dict)
    miss_dollars: dict[str, float] = field(default_factory=dict)
    # GPU energy of its apportioned GPU time (collector/cost/energy.py), and how it was
    # had: "modeled" (TDP x GPU-seconds) or "measured"; None: not priced.
    energy_joules: float = 0.0
    energy_provenance: str | None = None
    # The router's predicted prefix-cache hit (0-1 of the prompt), beside the engine's
    # actual one (cache_read_tokens / input_tokens): llm-d's prefix-cache scorer.
    router_predicted_cache_hit: float | None = None
    # Where cache_read_tokens came from (CACHE_SOURCE_*); None: nothing on the path said.
    cache_read_source: str | None = None
    # Its SLO class (tokenpath/slo.py), set where it is mapped; None: no classes configured.
    slo: str | None = None
    # "met", "missed" or "unknown" against its class's targets; None: no class.
    slo_outcome: str | None = None
    # A missed request's dominant stage (queue, prefill, decode, network) in the measure
    # it missed; None when it did not miss.
    slo_miss_stage: str | None = None
    # A disaggregated request (prefill on one engine, decode on another): the engine and
    # node that ran its prefill and those that ran its decode (``engine_id`` and ``node``
    # name the decode engine); None for a request one engine served.
    prefill_engine_id: str | None = None
    prefill_node: str | None = None
    decode_engine_id: str | None = None
    decode_node: str | None = None
    # Prompt tokens whose KV cache crossed from the prefill engine to the decode engine,
    # the bytes that took (tokens x the model's KV bytes per token; 0 when the model is
    # not in the catalog) and how the count was had: "relayed" (the kv_transfer_params
    # a proxy relayed) or "derived" (from the two engines' spans).
    kv_transfer_tokens: int | None = None
    kv_transfer_bytes: int | None = None
    kv_transfer_source: str | None = None

    def __init__(
        self,
        trace_id: str,
        record_id: str = "",
        model: str = UNKNOWN,
        request_id: str | None = None,
        status: str = "ok",
        node: str | None = None,
        pool: str | None = None,
        tenant: str | None = None,
        engine: str | None = None,
        engine_id: str | None = None,
        gpu_inventory: bool | None = None,
        gpu_type: str | None = None,
        tensor_parallel: int = 1,
        simulated: bool = False,
        start_unix: float = 0.0,
        end_unix: float = 0.0,
        input_tokens: int = 0,
        cache_read_tokens: int = 0,
        output_tokens: int = 0,
        ttft_seconds: float | None = None,
        tpot_seconds: float | None = None,
        queue_seconds: float | None = None,
        prefill_seconds: float | None = None,
        decode_seconds: float | None = None,
        prefill_start_unix: float | None = None,
        decode_start_unix: float | None = None,
        engine_end_unix: float | None = None,
        response_bytes: int = 0,
        response_chunks: int = 0,
        small_chunks: int = 0,
        response_packets: int = 0,
        prefix_fingerprints: tuple[str, ...] = (),
        prefix_block_tokens: int = 0,
        stages: dict[StageId, StageTiming] | None = None,
        cost_dollars: float = 0.0,
        naive_cost_dollars: float = 0.0,
        cache_miss_waste_dollars: float = 0.0,
        complete: bool = True,
        span_count: int = 0,
        engine_start_unix: float | None = None,
        engine_step_seconds: float | None = None,
        engine_steps: int | None = None,
        response_id: str | None = None,
        outer_hop: str | None = None,
        joined_trace_ids: tuple[str, ...] = (),
        client_start_unix: float | None = None,
        client_end_unix: float | None = None,
        miss_tokens: dict[str, int] | None = None,
        miss_dollars: dict[str, float] | None = None,
        energy_joules: float = 0.0,
        energy_provenance: str | None = None,
        router_predicted_cache_hit: float | None = None,
        cache_read_source: str | None = None,
        slo: str | None = None,
        slo_outcome: str | None = None,
        slo_miss_stage: str | None = None,
        prefill_engine_id: str | None = None,
        prefill_node: str | None = None,
        decode_engine_id: str | None = None,
        decode_node: str | None = None,
        kv_transfer_tokens: int | None = None,
        kv_transfer_bytes: int | None = None,
        kv_transfer_source: str | None = None,
    ) -> None:
        """Every field, in declaration order, by position or by name."""
        self.trace_id = trace_id
        self.record_id = record_id or trace_id
        self.model = model
        self.request_id = request_id
        self.status = status
        self.node = node
        self.pool = pool
        self.tenant = tenant
        self.engine = engine
        self.engine_id = engine_id
        self.gpu_inventory = gpu_inventory
        self.gpu_type = gpu_type
        self.tensor_parallel = tensor_parallel
        self.simulated = simulated
        self.start_unix = start_unix
        self.end_unix = end_unix
        self.input_tokens = input_tokens
        self.cache_read_tokens = cache_read_tokens
        self.output_tokens = output_tokens
        self.ttft_seconds = ttft_seconds
        self.tpot_seconds = tpot_seconds
        self.queue_seconds = queue_seconds
        self.prefill_seconds = prefill_seconds
        self.decode_seconds = decode_seconds
        self.prefill_start_unix = prefill_start_unix
        self.decode_start_unix = decode_start_unix
        self.engine_end_unix = engine_end_unix
        self.response_bytes = response_bytes
        self.response_chunks = response_chunks
        self.small_chunks = small_chunks
        self.response_packets = response_packets
        self.prefix_fingerprints = prefix_fingerprints
        self.prefix_block_tokens = prefix_block_tokens
        self.stages = {} if stages is None else stages
        self.cost_dollars = cost_dollars
        self.naive_cost_dollars = naive_cost_dollars
        self.cache_miss_waste_dollars = cache_miss_waste_dollars
        self.complete = complete
        self.span_count = span_count
        self.engine_start_unix = engine_start_unix
        self.engine_step_seconds = engine_step_seconds
        self.engine_steps = engine_steps
        self.response_id = response_id
        self.outer_hop = outer_hop
        self.joined_trace_ids = joined_trace_ids
        self.client_start_unix = client_start_unix
        self.client_end_unix = client_end_unix
        self.miss_tokens = {} if miss_tokens is None else miss_tokens
        self.miss_dollars = {} if miss_dollars is None else miss_dollars
        self.energy_joules = energy_joules
        self.energy_provenance = energy_provenance
        self.router_predicted_cache_hit = router_predicted_cache_hit
        self.cache_read_source = cache_read_source
        self.slo = slo
        self.slo_outcome = slo_outcome
        self.slo_miss_stage = slo_miss_stage
        self.prefill_engine_id = prefill_engine_id
        self.prefill_node = prefill_node
        self.decode_engine_id = decode_engine_id
        self.decode_node = decode_node
        self.kv_transfer_tokens = kv_transfer_tokens
        self.kv_transfer_bytes = kv_transfer_bytes
        self.kv_transfer_source = kv_transfer_source

    def to_json(self) -> dict[str, Any]:
        return {
            "trace_id": self.trace_id,
            "record_id": self.record_id,
            "model": self.model,
            "request_id": self.request_id,
            "status": self.status,
            "node": self.node,
            "pool": self.pool,
            "tenant": self.tenant,
            "engine": self.engine,
            "engine_id": self.engine_id,
            "gpu_inventory": self.gpu_inventory,
            "gpu_type": self.gpu_type,
            "tensor_parallel": self.tensor_parallel,
            "simulated": self.simulated,
            "start_unix": self.start_unix,
            "end_unix": self.end_unix,
            "duration_seconds": self.duration_seconds,
            "input_tokens": self.input_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "output_tokens": self.output_tokens,
            "ttft_seconds": self.ttft_seconds,
            "tpot_seconds": self.tpot_seconds,
            "queue_seconds": self.queue_seconds,
            "prefill_seconds": self.prefill_seconds,
            "decode_seconds": self.decode_seconds,
            "prefill_start_unix": self.prefill_start_unix,
            "decode_start_unix": self.decode_start_unix,
            "engine_end_unix": self.engine_end_unix,
            "response_bytes": self.response_bytes,
            "response_chunks": self.response_chunks,
            "small_chunks": self.small_chunks,
            "response_packets": self.response_packets,
            "prefix_fingerprints": list(self.prefix_fingerprints),
            "prefix_block_tokens": self.prefix_block_tokens,
            "stages": {PLAIN_VALUES[t.stage]: t.to_json() for t in self.ordered_stages()},
            "cost_dollars": self.cost_dollars,
            "naive_cost_dollars": self.naive_cost_dollars,
            "cache_miss_waste_dollars": self.cache_miss_waste_dollars,
            "complete": self.complete,
            "span_count": self.span_count,
            "engine_start_unix": self.engine_start_unix,
            "engine_step_seconds": self.engine_step_seconds,
            "engine_steps": self.engine_steps,
            "response_id": self.response_id,
            "outer_hop": self.outer_hop,
            "joined_trace_ids": list(self.joined_trace_ids),
            "client_start_unix": self.client_start_unix,
            "client_end_unix": self.client_end_unix,
            "miss_tokens": dict(self.miss_tokens),
            "miss_dollars": dict(self.miss_dollars),
            "energy_joules": self.energy_joules,
            "energy_provenance": self.energy_provenance,
            "router_predicted_cache_hit": self.router_predicted_cache_hit,
            "cache_read_source": self.cache_read_source,
            "slo": self.slo,
            "slo_outcome": self.slo_outcome,
            "slo_miss_stage": self.slo_miss_stage,
            "prefill_engine_id": self.prefill_engine_id,
            "prefill_node": self.prefill_node,
            "decode_engine_id": self.decode_engine_id,
            "decode_node": self.decode_node,
            "kv_transfer_tokens": self.kv_transfer_tokens,
            "kv_transfer_bytes": self.kv_transfer_bytes,
            "kv_transfer_source": self.kv_transfer_source,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestRecord:
        return cls(
            trace_id=str(data["trace_id"]),
            record_id=str(data.get("record_id") or data["trace_id"]),
            model=str(data.get("model", UNKNOWN)),
            request_id=data.get("request_id"),
            status=str(data.get("status", "ok")),
            node=data.get("node"),
            pool=data.get("pool"),
            tenant=data.get("tenant"),
            engine=data.get("engine"),
            engine_id=data.get("engine_id"),
            gpu_inventory=data.get("gpu_inventory"),
            gpu_type=data.get("gpu_type"),
            tensor_parallel=int(data.get("tensor_parallel") or 1),
            simulated=bool(data.get("simulated", False)),
            start_unix=float(data.get("start_unix") or 0.0),
            end_unix=float(data.get("end_unix") or 0.0),
            input_tokens=int(data.get("input_tokens") or 0),
            cache_read_tokens=int(data.get("cache_read_tokens") or 0),
            output_tokens=int(data.get("output_tokens") or 0),
            ttft_seconds=_opt_float(data.get("ttft_seconds")),
            tpot_seconds=_opt_float(data.get("tpot_seconds")),
            queue_seconds=_opt_float(data.get("queue_seconds")),
            prefill_seconds=_opt_float(data.get("prefill_seconds")),
            decode_seconds=_opt_float(data.get("decode_seconds")),
            prefill_start_unix=_opt_float(data.get("prefill_start_unix")),
            decode_start_unix=_opt_float(data.get("decode_start_unix")),
            engine_end_unix=_opt_float(data.get("engine_end_unix")),
            response_bytes=int(data.get("response_bytes") or 0),
            response_chunks=int(data.get("response_chunks") or 0),
            small_chunks=int(data.get("small_chunks") or 0),
            response_packets=int(data.get("response_packets") or 0),
            prefix_fingerprints=tuple(str(t) for t in data.get("prefix_fingerprints") or ()),
            prefix_block_tokens=int(data.get("prefix_block_tokens") or 0),
            stages={StageId(name): StageTiming.from_json(StageId(name), value)
                    for name, value in (data.get("stages") or {}).items()},
            cost_dollars=float(data.get("cost_dollars") or 0.0),
            naive_cost_dollars=float(data.get("naive_cost_dollars") or 0.0),
            cache_miss_waste_dollars=float(data.get("cache_miss_waste_dollars") or 0.0),
            complete=bool(data.get("complete", True)),
            span_count=int(data.get("span_count") or 0),
            engine_start_unix=_opt_float(data.get("engine_start_unix")),
            engine_step_seconds=_opt_float(data.get("engine_step_seconds")),
            engine_steps=_opt_int(data.get("engine_steps")),
            response_id=data.get("response_id"),
            outer_hop=data.get("outer_hop"),
            joined_trace_ids=tuple(str(t) for t in data.get("joined_trace_ids") or ()),
            client_start_unix=_opt_float(data.get("client_start_unix")),
            client_end_unix=_opt_float(data.get("client_end_unix")),
            miss_tokens={str(k): int(v) for k, v in (data.get("miss_tokens") or {}).items()},
            miss_dollars={str(k): float(v or 0.0)
                    for k, v in (data.get("miss_dollars") or {}).items()},
            energy_joules=float(data.get("energy_joules") or 0.0),
            energy_provenance=data.get("energy_provenance"),
            router_predicted_cache_hit=_opt_float(data.get("router_predicted_cache_hit")),
            cache_read_source=data.get("cache_read_source"),
            slo=data.get("slo"),
            slo_outcome=data.get("slo_outcome"),
            slo_miss_stage=data.get("slo_miss_stage"),
            prefill_engine_id=data.get("prefill_engine_id"),
            prefill_node=data.get("prefill_node"),
            decode_engine_id=data.get("decode_engine_id"),
            decode_node=data.get("decode_node"),
            kv_transfer_tokens=_opt_int(data.get("kv_transfer_tokens")),
            kv_transfer_bytes=_opt_int(data.get("kv_transfer_bytes")),
            kv_transfer_source=data.get("kv_transfer_source"),
        )
    # --- end of the generated part ---

    @property
    def duration_seconds(self) -> float:
        return max(0.0, self.end_unix - self.start_unix)

    @property
    def gpu_cost_dollars(self) -> float:
        from tokenpath.stages import GPU_STAGES

        return sum(self.stages[s].cost_dollars for s in GPU_STAGES if s in self.stages)

    def ordered_stages(self) -> list[StageTiming]:
        """Stage timings in path order."""
        return [self.stages[s] for s in STAGE_IDS if s in self.stages]


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True, slots=True)
class IdleCost:
    """GPU dollars of a pool's time slice in which no request was active."""

    pool: str
    start_unix: float
    end_unix: float
    dollars: float
    energy_joules: float = 0.0  # measured or modeled (collector/cost/energy.py)
