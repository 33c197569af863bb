"""The report from a list of records (views.report_view's oracle): every figure summed
exactly, percentiles interpolated between order statistics."""

from __future__ import annotations

import math
from collections.abc import Sequence

from testkit.oracles.last_mile import summarize_last_mile
from testkit.oracles.slo import summarize_records
from tokenpath.identity import pricing_unit
from tokenpath.leaks import LONG_CONTEXT_TOKENS, MissCause, context_tokens
from tokenpath.records import RequestRecord
from tokenpath.report import (
    MissCauseSummary,
    Report,
    StageSummary,
    combined_energy_provenance,
    token_weighted_hit_ratio,
)
from tokenpath.stages import PROVENANCE_RANK, STAGES, Phase, Provenance


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..1); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def miss_causes(records: Sequence[RequestRecord]) -> dict[str, MissCauseSummary]:
    """Every cause, in the enum's order, summed over the records (0 where none)."""
    return {cause.value: MissCauseSummary(
        cause, sum(r.miss_tokens.get(cause.value, 0) for r in records),
        sum(r.miss_dollars.get(cause.value, 0.0) for r in records)) for cause in MissCause}


def energy_provenance(records: Sequence[RequestRecord]) -> str | None:
    """``measured`` when every priced record's energy was, ``modeled`` when any was."""
    return combined_energy_provenance(r.energy_provenance for r in records)


def build_report(records: Sequence[RequestRecord], idle_cost_dollars: float = 0.0,
                 idle_energy_joules: float = 0.0) -> Report:
    """Aggregate records into the report; stages listed in path order, all 15."""
    window = 0.0
    if records:
        window = max(r.end_unix for r in records) - min(r.start_unix for r in records)
    total_stage_seconds = sum(t.seconds for r in records for t in r.stages.values())
    stages: list[StageSummary] = []
    for stage in STAGES:
        timings = [r.stages[stage.id] for r in records if stage.id in r.stages]
        seconds = [t.seconds for t in timings]
        provenance: Provenance | None = None
        phase_seconds: dict[Phase, float] = {}
        phase_cost: dict[Phase, float] = {}
        for t in timings:
            if provenance is None or PROVENANCE_RANK[t.provenance] > PROVENANCE_RANK[provenance]:
                provenance = t.provenance
            for phase, share in t.phases.items():
                phase_seconds[phase] = phase_seconds.get(phase, 0.0) + share.seconds
                phase_cost[phase] = phase_cost.get(phase, 0.0) + share.cost_dollars
        stages.append(
            StageSummary(
                stage=stage.id,
                requests=len(timings),
                p50_seconds=percentile(seconds, 0.5),
                p95_seconds=percentile(seconds, 0.95),
                mean_seconds=sum(seconds) / len(seconds) if seconds else None,
                cost_dollars=sum(t.cost_dollars for t in timings),
                provenance=provenance,
                share_of_latency=sum(seconds) / total_stage_seconds if total_stage_seconds else 0.0,
                phase_seconds=phase_seconds,
                phase_cost_dollars=phase_cost,
            )
        )
    ttfts = [r.ttft_seconds for r in records if r.ttft_seconds is not None]
    tpots = [r.tpot_seconds for r in records if r.tpot_seconds is not None]
    output_tokens = sum(r.output_tokens for r in records)
    cost = sum(r.cost_dollars for r in records)
    chunks = sum(r.response_chunks for r in records)
    long_context = [r for r in records if context_tokens(r) >= LONG_CONTEXT_TOKENS]
    long_context_cost = sum(r.cost_dollars for r in long_context)
    last_mile = summarize_last_mile(records)
    return Report(
        requests=len(records),
        complete_requests=sum(1 for r in records if r.complete),
        window_seconds=window,
        stages=stages,
        ttft_p50_seconds=percentile(ttfts, 0.5),
        ttft_p95_seconds=percentile(ttfts, 0.95),
        tpot_p50_seconds=percentile(tpots, 0.5),
        output_tokens_per_second=output_tokens / window if window > 0 else 0.0,
        input_tokens=sum(r.input_tokens for r in records),
        cache_read_tokens=sum(r.cache_read_tokens for r in records),
        output_tokens=output_tokens,
        prefix_cache_hit_ratio=token_weighted_hit_ratio(records),
        cost_dollars=cost,
        idle_cost_dollars=idle_cost_dollars,
        cache_miss_waste_dollars=sum(r.cache_miss_waste_dollars for r in records),
        naive_cost_dollars=sum(r.naive_cost_dollars for r in records),
        cost_per_million_output_tokens=(
            (cost + idle_cost_dollars) / output_tokens * 1e6 if output_tokens else None
        ),
        prefill_seconds=sum(r.prefill_seconds or 0.0 for r in records),
        decode_seconds=sum(r.decode_seconds or 0.0 for r in records),
        small_packet_share=(sum(r.small_chunks for r in records) / chunks) if chunks else None,
        long_context_requests=len(long_context),
        long_context_cost_dollars=long_context_cost,
        long_context_share_of_cost=long_context_cost / cost if cost > 0 else None,
        models=sorted({r.model for r in records}),
        simulated=any(r.simulated for r in records),
        units_without_inventory=sorted({pricing_unit(r.node, r.engine_id) for r in records
                                        if r.gpu_inventory is False}),
        miss_by_cause=miss_causes(records),
        packets_per_output_token=last_mile.packets_per_output_token,
        wire_bytes_per_payload_byte=last_mile.wire_bytes_per_payload_byte,
        leaking_streams=last_mile.leaking_streams,
        streams=last_mile.streams,
        energy_joules=sum(r.energy_joules for r in records),
        idle_energy_joules=idle_energy_joules,
        energy_provenance=energy_provenance(records),
        slo=summarize_records(records, window),
    )
