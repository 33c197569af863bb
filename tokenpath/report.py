"""The per-stage report's shape: the Report, StageSummary and MissCauseSummary classes and
their JSON (docs/reference.md, report JSON). tokenpath/views.py fills them from a store's
aggregates (views.report_view); rendering lives in tokenpath.cli.render. The report from a
list of records, which the tests check the view against, is testkit/oracles/report.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenpath.leaks import LONG_CONTEXT_TOKENS, MISS_CAUSE_FIXES, WASTE_CAUSES, MissCause
from tokenpath.records import RequestRecord
from tokenpath.slo import SloSummary
from tokenpath.stages import Phase, Provenance, StageId


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


def combined_energy_provenance(kinds: Iterable[str | None]) -> str | None:
    """The provenance of a sum of joules: ``measured`` only when every part was."""
    present = {k for k in kinds if k}
    if not present:
        return None
    measured = Provenance.MEASURED.value
    return measured if present == {measured} else Provenance.MODELED.value
