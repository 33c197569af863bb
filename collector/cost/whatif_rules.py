"""``tokenpath whatif --rules-of-thumb``: industry claims beside the model's projection for
the recorded workload (docs/cost-model.md). Every projection is modeled."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tokenpath.collector.cost.whatif import (
    DEFAULT_SPEC_ACCEPTANCE,
    DEFAULT_SPEC_DRAFT_TOKENS,
    Calibration,
    Scenario,
    project,
    speculative_speedup,
)

LONG_CONTEXT_SCALE = 4.0  # "long contexts": every prompt four times longer


@dataclass(frozen=True, slots=True)
class RuleCheck:
    claim: str
    rule_of_thumb: str
    model_says: str
    value: float
    agrees: bool

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _pct(value: float) -> str:
    return f"{value * 100:+.1f}%"


def check_rules_of_thumb(calibration: Calibration) -> list[RuleCheck]:
    base = project(calibration, Scenario())
    checks: list[RuleCheck] = []

    plus_one = project(calibration, Scenario(cache_hit_rate_delta=0.01))
    gain = plus_one.requests_per_second_per_gpu / base.requests_per_second_per_gpu - 1
    checks.append(RuleCheck(
        "+1 pp prefix-cache hit rate", "+0.5 to 1% requests/s per GPU",
        f"{_pct(gain)} requests/s per GPU", gain, 0.005 <= gain <= 0.01))

    speedup = speculative_speedup(DEFAULT_SPEC_ACCEPTANCE, DEFAULT_SPEC_DRAFT_TOKENS)
    spec = project(calibration, Scenario(spec_decode_speedup=speedup))
    decode_gain = (base.decode_gpu_seconds / spec.decode_gpu_seconds
                   if spec.decode_gpu_seconds else 1.0)
    checks.append(RuleCheck(
        "speculative decoding", "2 to 3x decode throughput, less memory-bandwidth pressure",
        f"{decode_gain:.2f}x decode throughput at acceptance {DEFAULT_SPEC_ACCEPTANCE}, "
        f"{DEFAULT_SPEC_DRAFT_TOKENS} draft tokens (weights read once per "
        f"{speedup:.2f} tokens)", decode_gain, 2.0 <= decode_gain <= 3.0))

    low = project(calibration, Scenario(gpu_utilization=0.5))
    high = project(calibration, Scenario(gpu_utilization=0.8))
    unit = high.cost_per_million_output_tokens / low.cost_per_million_output_tokens - 1
    checks.append(RuleCheck(
        "GPU utilization 50% -> 80% (continuous batching)", "about 30% lower unit cost",
        f"{_pct(unit)} cost per million output tokens", unit, -0.40 <= unit <= -0.25))

    cached = project(calibration, Scenario())
    uncached = project(calibration, Scenario(disable_cache=True))
    repeated_saving = 0.0
    if calibration.hit_ratio > 0 and uncached.prefill_gpu_seconds > 0:
        extra = uncached.prefill_gpu_seconds - cached.prefill_gpu_seconds
        # Cost of the repeated input with the cache: reading its KV instead of recomputing.
        repeated_saving = extra / uncached.prefill_gpu_seconds / calibration.hit_ratio
        repeated_saving = min(1.0, repeated_saving)
    checks.append(RuleCheck(
        "prompt caching of repeated prefixes", "up to 90% lower cost of the repeated input",
        f"{_pct(-repeated_saving)} prefill GPU time per repeated input token "
        f"(recorded hit ratio {calibration.hit_ratio:.2f})", repeated_saving,
        repeated_saving >= 0.5))

    worst = project(calibration, Scenario(disable_cache=True, context_scale=LONG_CONTEXT_SCALE))
    ratio = worst.requests_per_second_per_gpu / base.requests_per_second_per_gpu
    checks.append(RuleCheck(
        "no caching + no quantization + long contexts", "requests/s per GPU halves or worse",
        f"{ratio:.2f}x requests/s per GPU with no cache and {LONG_CONTEXT_SCALE:g}x prompts",
        ratio, ratio <= 0.5))
    return checks
