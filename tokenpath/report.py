"""The per-stage report: aggregates of request records (docs/reference.md, report JSON).

Pure statistics over RequestRecords; rendering lives in tokenpath.cli.render.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenpath.identity import pricing_unit
from tokenpath.last_mile import summarize_last_mile
from tokenpath.leaks import (
    LONG_CONTEXT_TOKENS,
    MISS_CAUSE_FIXES,
    WASTE_CAUSES,
    MissCause,
    context_tokens,
)
from tokenpath.records import RequestRecord
from tokenpath.slo import SloSummary, summarize_records
from tokenpath.stages import PROVENANCE_RANK, STAGES, Phase, Provenance, StageId


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


def token_weighted_hit_ratio(records: Sequence[RequestRecord]) -> float | None:
    """cache_read tokens / input tokens, summed over requests (never a mean of ratios)."""
    inputs = sum(r.input_tokens for r in records)
    if inputs <= 0:
        return None
    return sum(r.cache_read_tokens for r in records) / inputs


@dataclass(slots=True)
class StageSummary:
    stage: StageId
    requests: int
    p50_seconds: float | None
    p95_seconds: float | None
    mean_seconds: float | None
    cost_dollars: float
    provenance: Provenance | None
    share_of_latency: float
    phase_seconds: dict[Phase, float] = field(default_factory=dict)
    phase_cost_dollars: dict[Phase, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage.value,
            "requests": self.requests,
            "p50_seconds": self.p50_seconds,
            "p95_seconds": self.p95_seconds,
            "mean_seconds": self.mean_seconds,
            "cost_dollars": self.cost_dollars,
            "provenance": self.provenance.value if self.provenance else None,
            "share_of_latency": self.share_of_latency,
            "phases": {
                phase.value: {
                    "seconds": self.phase_seconds.get(phase, 0.0),
                    "cost_dollars": self.phase_cost_dollars.get(phase, 0.0),
                }
                for phase in Phase
                if phase in self.phase_seconds or phase in self.phase_cost_dollars
            },
        }


@dataclass(slots=True)
class Report:
    requests: int
    complete_requests: int
    window_seconds: float
    stages: list[StageSummary]
    ttft_p50_seconds: float | None
    ttft_p95_seconds: float | None
    tpot_p50_seconds: float | None
    output_tokens_per_second: float
    input_tokens: int
    cache_read_tokens: int
    output_tokens: int
    prefix_cache_hit_ratio: float | None
    cost_dollars: float
    idle_cost_dollars: float
    cache_miss_waste_dollars: float
    naive_cost_dollars: float
    cost_per_million_output_tokens: float | None
    prefill_seconds: float
    decode_seconds: float
    small_packet_share: float | None
    long_context_requests: int
    long_context_cost_dollars: float
    long_context_share_of_cost: float | None
    models: list[str]
    simulated: bool
    # Pricing units (nodes, else engines) with no inventory entry in the price sheet:
    # priced as their engines' tensor-parallel GPUs of the default GPU type.
    units_without_inventory: list[str] = field(default_factory=list)
    # Prefix-cache misses by cause (tokenpath.leaks.MissCause values)
    miss_by_cause: dict[str, MissCauseSummary] = field(default_factory=dict)
    # Leak 3: token-weighted over the streamed requests (collector/cost/last_mile.py)
    packets_per_output_token: float | None = None
    wire_bytes_per_payload_byte: float | None = None
    leaking_streams: int = 0
    streams: int = 0
    # GPU energy (collector/cost/energy.py): the records' and the idle GPUs'
    energy_joules: float = 0.0
    idle_energy_joules: float = 0.0
    energy_provenance: str | None = None
    # The window a store's view covers and what the store keeps (tokenpath/views.py).
    window: dict[str, Any] | None = None
    # SLO classes (tokenpath/slo.py): goodput, dollars per good request, missed dollars;
    # None when no record has a class.
    slo: SloSummary | None = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "requests": self.requests,
            "complete_requests": self.complete_requests,
            "window_seconds": self.window_seconds,
            "stages": [s.to_json() for s in self.stages],
            "ttft_p50_seconds": self.ttft_p50_seconds,
            "ttft_p95_seconds": self.ttft_p95_seconds,
            "tpot_p50_seconds": self.tpot_p50_seconds,
            "output_tokens_per_second": self.output_tokens_per_second,
            "input_tokens": self.input_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "output_tokens": self.output_tokens,
            "prefix_cache_hit_ratio": self.prefix_cache_hit_ratio,
            "cost_dollars": self.cost_dollars,
            "idle_cost_dollars": self.idle_cost_dollars,
            "cache_miss_waste_dollars": self.cache_miss_waste_dollars,
            "naive_cost_dollars": self.naive_cost_dollars,
            "cost_per_million_output_tokens": self.cost_per_million_output_tokens,
            "prefill_seconds": self.prefill_seconds,
            "decode_seconds": self.decode_seconds,
            "small_packet_share": self.small_packet_share,
            "long_context_tokens": LONG_CONTEXT_TOKENS,
            "long_context_requests": self.long_context_requests,
            "long_context_cost_dollars": self.long_context_cost_dollars,
            "long_context_share_of_cost": self.long_context_share_of_cost,
            "models": self.models,
            "simulated": self.simulated,
            "units_without_inventory": self.units_without_inventory,
            "cache_miss_by_cause": {c: m.to_json() for c, m in self.miss_by_cause.items()},
            "packets_per_output_token": self.packets_per_output_token,
            "wire_bytes_per_payload_byte": self.wire_bytes_per_payload_byte,
            "leaking_streams": self.leaking_streams,
            "streams": self.streams,
            "energy_joules": self.energy_joules,
            "idle_energy_joules": self.idle_energy_joules,
            "energy_provenance": self.energy_provenance,
            "energy_joules_per_output_token": (self.energy_joules / self.output_tokens
                                               if self.output_tokens else None),
        }
        out["slo"] = None if self.slo is None else self.slo.to_json()
        if self.window is not None:
            out["window"] = self.window
        return out


@dataclass(frozen=True, slots=True)
class MissCauseSummary:
    """One cause of prefix-cache misses over a set of records, and its fix."""

    cause: MissCause
    tokens: int
    dollars: float

    @property
    def waste(self) -> bool:
        return self.cause in WASTE_CAUSES

    @property
    def fix(self) -> str:
        return MISS_CAUSE_FIXES[self.cause]

    def to_json(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "dollars": self.dollars, "waste": self.waste,
                "fix": self.fix}


def miss_causes(records: Sequence[RequestRecord]) -> dict[str, MissCauseSummary]:
    """Every cause, in the enum's order, summed over the records (0 where none)."""
    return {cause.value: MissCauseSummary(
        cause, sum(r.miss_tokens.get(cause.value, 0) for r in records),
        sum(r.miss_dollars.get(cause.value, 0.0) for r in records)) for cause in MissCause}


def energy_provenance(records: Sequence[RequestRecord]) -> str | None:
    """``measured`` when every priced record's energy was, ``modeled`` when any was."""
    return combined_energy_provenance(r.energy_provenance for r in records)


def combined_energy_provenance(kinds: Iterable[str | None]) -> str | None:
    """The provenance of a sum of joules: ``measured`` only when every part was."""
    present = {k for k in kinds if k}
    if not present:
        return None
    measured = Provenance.MEASURED.value
    return measured if present == {measured} else Provenance.MODELED.value


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
