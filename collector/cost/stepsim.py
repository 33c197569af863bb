"""A small step-level engine simulator with per-request GPU ground truth.

Used by the tests and ``bench/attribution.py`` to measure how well the attributor, which
sees only the records (timestamps and token counts, as spans give them), reconstructs
each request's share of GPU time. Continuous batching: every step admits waiting requests
(their prefill, optionally chunked) and decodes one token for every running sequence. The
step lasts ``Roofline.step_seconds``; its duration is split among its sequences by
``Roofline.sequence_work``, which is the ground truth (docs/reference.md, ``--ground-truth``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from tokenpath.records import PhaseShare, RequestRecord, StageTiming
from tokenpath.roofline import Roofline
from tokenpath.stages import Phase, Provenance, StageId

DEFAULT_MAX_BATCH = 32


@dataclass(slots=True)
class SimRequest:
    trace_id: str
    arrival: float
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    prefix_fingerprints: tuple[str, ...] = ()
    # filled by the simulation
    prefilled: int = 0
    generated: int = 0
    prefill_start: float | None = None
    decode_start: float | None = None
    end: float | None = None
    gpu_seconds: float = 0.0
    prefill_steps: int = 0
    decode_steps: int = 0


@dataclass(slots=True)
class SimResult:
    records: list[RequestRecord]
    ground_truth: list[dict[str, Any]]
    busy_seconds: float
    window: tuple[float, float]
    steps: int = 0
    batch_sizes: list[int] = field(default_factory=list)
    step_starts: list[float] = field(default_factory=list)


def simulate(
    requests: list[SimRequest],
    roofline: Roofline,
    dollars_per_gpu_second: float,
    node: str = "sim-node-0",
    pool: str = "sim",
    gpu_type: str = "H100-SXM",
    model: str = "llama-3.1-8b",
    max_batch: int = DEFAULT_MAX_BATCH,
    prefill_chunk_tokens: int | None = None,
    record_dispatch: bool = False,
) -> SimResult:
    """Run ``requests`` through one engine; records as a collector would build them.

    With ``record_dispatch`` each record carries a measured per-phase gpu_dispatch (steps x
    step overhead), as an engine hook records it."""
    waiting = sorted(requests, key=lambda r: r.arrival)
    running: list[SimRequest] = []
    now = waiting[0].arrival if waiting else 0.0
    start = now
    busy = 0.0
    steps = 0
    batch_sizes: list[int] = []
    step_starts: list[float] = []
    index = 0
    while index < len(waiting) or running:
        while (index < len(waiting) and waiting[index].arrival <= now
               and len(running) < max_batch):
            running.append(waiting[index])
            index += 1
        if not running:
            now = waiting[index].arrival
            continue
        entries: list[tuple[SimRequest, float, float, int]] = []
        for req in running:
            new = max(1, req.input_tokens - req.cached_tokens)
            if req.prefilled < new:
                if req.prefill_start is None:
                    req.prefill_start = now
                chunk = new - req.prefilled
                if prefill_chunk_tokens is not None:
                    chunk = min(chunk, prefill_chunk_tokens)
                before = req.cached_tokens + req.prefilled
                entries.append((req, roofline.prefill_flops(chunk, before),
                                roofline.prefill_bytes(chunk, before), chunk))
            else:
                ctx = req.input_tokens + req.generated
                entries.append((req, roofline.decode_flops(ctx), roofline.decode_bytes(ctx), 1))
        batch = len(entries)
        flops = sum(e[1] for e in entries)
        seq_bytes = sum(e[2] for e in entries)
        tokens = sum(e[3] for e in entries)
        duration = roofline.step_seconds(flops, seq_bytes, tokens)
        work = [roofline.sequence_work(e[1], e[2], batch) for e in entries]
        total_work = sum(work)
        end = now + duration
        finished: list[SimRequest] = []
        for (req, _, _, chunk), w in zip(entries, work, strict=True):
            req.gpu_seconds += duration * w / total_work
            new = max(1, req.input_tokens - req.cached_tokens)
            if req.prefilled < new:
                req.prefill_steps += 1
                req.prefilled += chunk
                if req.prefilled >= new:
                    req.decode_start = end
                    req.generated = 1
            else:
                req.decode_steps += 1
                req.generated += 1
            if req.prefilled >= new and req.generated >= max(1, req.output_tokens):
                req.end = end
                finished.append(req)
        running = [r for r in running if r not in finished]
        busy += duration
        steps += 1
        batch_sizes.append(batch)
        step_starts.append(now)
        now = end
    price = dollars_per_gpu_second * roofline.tensor_parallel
    records = [_record(r, node, pool, gpu_type, model, roofline.tensor_parallel)
               for r in requests]
    if record_dispatch:
        overhead = roofline.step_overhead_seconds
        for req, record in zip(requests, records, strict=True):
            phases = {Phase.PREFILL: PhaseShare(req.prefill_steps * overhead)}
            if req.decode_steps:
                phases[Phase.DECODE] = PhaseShare(req.decode_steps * overhead)
            record.stages[StageId.GPU_DISPATCH] = StageTiming(
                StageId.GPU_DISPATCH, sum(p.seconds for p in phases.values()),
                Provenance.MEASURED, phases=phases)
            record.engine_steps = req.prefill_steps + req.decode_steps  # as the hook counts
    truth = [{"trace_id": r.trace_id, "gpu_seconds": r.gpu_seconds,
              "gpu_cost_dollars": r.gpu_seconds * price} for r in requests]
    return SimResult(records, truth, busy, (start, now), steps, batch_sizes, step_starts)


def _record(req: SimRequest, node: str, pool: str, gpu_type: str, model: str,
            tensor_parallel: int) -> RequestRecord:
    assert req.prefill_start is not None and req.decode_start is not None
    assert req.end is not None
    return RequestRecord(
        trace_id=req.trace_id,
        model=model,
        node=node,
        pool=pool,
        engine="simulated",
        gpu_type=gpu_type,
        tensor_parallel=tensor_parallel,
        simulated=True,
        start_unix=req.arrival,
        end_unix=req.end,
        input_tokens=req.input_tokens,
        cache_read_tokens=req.cached_tokens,
        output_tokens=req.output_tokens,
        ttft_seconds=req.decode_start - req.arrival,
        queue_seconds=req.prefill_start - req.arrival,
        prefill_seconds=req.decode_start - req.prefill_start,
        decode_seconds=req.end - req.decode_start,
        prefill_start_unix=req.prefill_start,
        decode_start_unix=req.decode_start,
        engine_end_unix=req.end,
        prefix_fingerprints=req.prefix_fingerprints,
    )


def random_workload(
    seed: int,
    count: int,
    rps: float,
    block_tokens: int = 16,
    system_prompts: int = 4,
    system_prompt_tokens: int = 512,
    hit_probability: float = 0.7,
) -> list[SimRequest]:
    """Poisson arrivals, repeated system prompts, a mix of context lengths."""
    rng = random.Random(seed)
    t = 1_700_000_000.0
    out: list[SimRequest] = []
    for i in range(count):
        t += rng.expovariate(rps)
        system = rng.randrange(system_prompts)
        user = rng.choice((64, 256, 1024, 4096, 12000))
        user = max(1, int(user * rng.uniform(0.5, 1.5)))
        input_tokens = system_prompt_tokens + user
        cached = system_prompt_tokens if rng.random() < hit_probability else 0
        blocks = input_tokens // block_tokens
        shared = system_prompt_tokens // block_tokens
        fingerprints = tuple(
            f"{system:04x}{b:04x}" if b < shared else f"u{i:07x}{b:04x}" for b in range(blocks)
        )
        out.append(SimRequest(
            trace_id=f"{i + 1:032x}", arrival=t, input_tokens=input_tokens,
            cached_tokens=cached, output_tokens=rng.choice((1, 16, 64, 200, 500)),
            prefix_fingerprints=fingerprints,
        ))
    return out
