"""Synthetic request records shaped like a priced collector's, for the store bench and the
store's tests: all 15 stages with their provenance, GPU stages split into prefill and
decode shares, a shared system-prompt prefix in the fingerprints (up to 64 a request),
cache misses by cause, tenants, models, nodes and engines, energy. Deterministic per seed;
about 4.5 KB of JSON a record, as the collector writes them.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from tokenpath.leaks import MissCause
from tokenpath.records import PhaseShare, RequestRecord, StageTiming
from tokenpath.slo import SloClass, SloConfig, classify_record
from tokenpath.stages import GPU_STAGES, NETWORK_STAGES, STAGES, Phase, Provenance, StageGroup

MODELS = ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-70B-Instruct",
          "mistral-7b-instruct", "unknown-model")
TENANTS = (*(f"team-{i:02d}" for i in range(12)), None)
NODES = tuple(f"gpu-node-{i:02d}" for i in range(8))
POOLS = ("pool-a", "pool-b", None)
SYSTEM_PROMPTS = 6
CAUSES = tuple(c.value for c in MissCause)
PROVENANCE = {StageGroup.CLIENT: Provenance.MEASURED, StageGroup.GATEWAY: Provenance.MEASURED,
              StageGroup.ENGINE: Provenance.MEASURED, StageGroup.GPU: Provenance.MODELED,
              StageGroup.NETWORK: Provenance.DERIVED}


def _hex(rng: random.Random, digits: int) -> str:
    return format(rng.getrandbits(digits * 4), f"0{digits}x")


# SLO classes the records are classified by (as the collector's mapper classifies them):
# one team's traffic held to a tight TTFT, a model's to a time per output token, the rest
# to loose targets; a record of a tenantless request with no TTFT of its own is unknown.
SLO_CLASSES = SloConfig((
    SloClass("interactive", ttft_seconds=0.08, tpot_seconds=0.03, objective=0.99,
             tenant="team-00"),
    SloClass("big-model", tpot_seconds=0.02, objective=0.95, model=MODELS[1]),
    SloClass("batch", ttft_seconds=0.3, e2e_seconds=20.0, objective=0.9),
))


def _no_attributes(key: str) -> str | None:
    return None


def synthetic_record(i: int, end_unix: float, rng: random.Random) -> RequestRecord:
    """Record ``i``, ended at ``end_unix``, classified by :data:`SLO_CLASSES`."""
    record = _record(i, end_unix, rng)
    if record.tenant is None and i % 3 == 0:
        record.ttft_seconds = None
    classify_record(record, SLO_CLASSES, _no_attributes)
    return record


def _record(i: int, end_unix: float, rng: random.Random) -> RequestRecord:
    model = MODELS[rng.randrange(len(MODELS))]
    node = NODES[rng.randrange(len(NODES))]
    input_tokens = int(rng.lognormvariate(7.0, 1.2)) + 1
    output_tokens = int(rng.lognormvariate(5.0, 1.0))
    cached = rng.randrange(0, input_tokens) if rng.random() < 0.6 else 0
    ttft = rng.lognormvariate(-2.5, 0.8)
    tpot = rng.lognormvariate(-4.0, 0.4)
    duration = ttft + tpot * output_tokens
    start = end_unix - duration
    trace = format(i * 2654435761 % (1 << 128) | 1 << 127, "032x")
    stages: dict = {}
    for stage in STAGES:
        if rng.random() < 0.04 and stage.group is not StageGroup.GPU:
            continue  # not every hop is instrumented on every request
        seconds = rng.lognormvariate(-6.0, 1.5)
        dollars = seconds * 2e-4 if stage.group is not StageGroup.GPU else seconds * 1.1e-3
        timing = StageTiming(stage.id, seconds, PROVENANCE[stage.group], dollars)
        if stage.id in GPU_STAGES:
            share = rng.random()
            timing.phases[Phase.PREFILL] = PhaseShare(seconds * share, dollars * share)
            timing.phases[Phase.DECODE] = PhaseShare(seconds * (1 - share),
                                                     dollars * (1 - share))
        elif stage.id in NETWORK_STAGES and rng.random() < 0.1:
            timing.phases[Phase.KV_TRANSFER] = PhaseShare(seconds / 2, dollars / 2)
        stages[stage.id] = timing
    cost = sum(t.cost_dollars for t in stages.values())
    prompt = rng.randrange(SYSTEM_PROMPTS)
    blocks = min(64, input_tokens // 64)
    shared = min(blocks, 8 + prompt * 4)
    fingerprints = tuple(format((prompt * 1000 + b) * 0x9E3779B97F4A7C15 % (1 << 64), "016x")
                         for b in range(shared)) + tuple(_hex(rng, 16)
                                                          for _ in range(blocks - shared))
    miss_tokens: dict[str, int] = {}
    miss_dollars: dict[str, float] = {}
    for cause in rng.sample(CAUSES, rng.randrange(0, 3)):
        tokens = rng.randrange(16, 2048)
        miss_tokens[cause] = tokens
        miss_dollars[cause] = tokens * 3e-8
    waste = sum(d for c, d in miss_dollars.items() if c != MissCause.COLD.value)
    chunks = output_tokens + 2 if rng.random() < 0.8 else 1
    response_bytes = chunks * rng.randrange(60, 140)
    return RequestRecord(
        trace_id=trace, model=model, request_id="req-" + _hex(rng, 24),
        status="ok" if rng.random() < 0.98 else "error", node=node,
        pool=POOLS[rng.randrange(len(POOLS))], tenant=TENANTS[rng.randrange(len(TENANTS))],
        engine="vllm", engine_id=f"{node}/engine-{rng.randrange(2)}",
        gpu_inventory=rng.random() < 0.9, gpu_type="H100-SXM",
        tensor_parallel=rng.choice((1, 2, 4)), start_unix=start, end_unix=end_unix,
        input_tokens=input_tokens, cache_read_tokens=cached, output_tokens=output_tokens,
        ttft_seconds=ttft, tpot_seconds=tpot if output_tokens > 1 else None,
        queue_seconds=rng.lognormvariate(-5.0, 1.0), prefill_seconds=ttft * 0.7,
        decode_seconds=tpot * output_tokens, prefill_start_unix=start + ttft * 0.2,
        decode_start_unix=start + ttft, engine_end_unix=end_unix - 0.001,
        response_bytes=response_bytes, response_chunks=chunks,
        small_chunks=chunks // 2, response_packets=chunks if rng.random() < 0.5 else 0,
        prefix_fingerprints=fingerprints, prefix_block_tokens=64, stages=stages,
        cost_dollars=cost, naive_cost_dollars=cost * 1.7, cache_miss_waste_dollars=waste,
        complete=rng.random() < 0.97, span_count=rng.randrange(3, 20),
        engine_start_unix=start + 0.002, engine_step_seconds=duration * 0.9,
        engine_steps=output_tokens + 1, response_id="chatcmpl-" + _hex(rng, 24),
        miss_tokens=miss_tokens, miss_dollars=miss_dollars,
        energy_joules=cost * 1.5e4, energy_provenance="modeled" if rng.random() < 0.9
        else "measured", router_predicted_cache_hit=rng.random() if rng.random() < 0.3 else None)


def synthetic_records(count: int, end_unix: float, span_seconds: float = 86_400.0,
                      seed: int = 7, first: int = 0) -> Iterator[RequestRecord]:
    """``count`` records ending evenly over the ``span_seconds`` before ``end_unix``,
    oldest first."""
    rng = random.Random(seed * 1_000_003 + first)
    step = span_seconds / max(1, count)
    start = end_unix - span_seconds
    for i in range(first, first + count):
        yield synthetic_record(i, start + (i - first + 1) * step, rng)
