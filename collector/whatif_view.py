"""POST /api/whatif: baseline and projected figures for the UI's what-if form.

The real engine (issue 4/9, ``tokenpath whatif``) is expected at
``tokenpath.whatif.whatif_json(records, idle_cost_dollars, *, cache_hit_rate_delta,
spec_decode_speedup, gpu_utilization, quantization) -> {"baseline": {...},
"projected": {...}}``. When that is not importable, a deliberately simple fallback
projection answers instead, labelled ``engine: "fallback"`` with its assumptions listed,
so the UI never presents it as the roofline model's output.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tokenpath.config import ConfigError
from tokenpath.records import RequestRecord
from tokenpath.report import build_report
from tokenpath.stages import GPU_STAGES, Phase

WHATIF_MODULE = "tokenpath.whatif"
WHATIF_FUNCTION = "whatif_json"
QUANTIZATIONS = ("none", "int8", "int4")
# Fallback assumptions (documented in docs/ui.md): cost multipliers per phase.
# Decode is memory-bound, so fewer weight bytes shorten it; int4 weights are dequantized
# to 16-bit for the matmuls, so prefill barely gains.
QUANTIZATION_FACTORS: dict[str, tuple[float, float]] = {  # (prefill, decode)
    "none": (1.0, 1.0),
    "int8": (0.6, 0.55),
    "int4": (0.9, 0.35),
}
DEFAULT_BASELINE_UTILIZATION = 0.5  # assumed when no idle cost was recorded


@dataclass(frozen=True, slots=True)
class WhatIfRequest:
    cache_hit_rate_delta: float = 0.0
    spec_decode_speedup: float = 1.0
    gpu_utilization: float | None = None
    quantization: str = "none"

    def validate(self) -> None:
        if not -1.0 <= self.cache_hit_rate_delta <= 1.0:
            raise ConfigError("cache_hit_rate_delta", "must be between -1 and 1")
        if not 1.0 <= self.spec_decode_speedup <= 10.0:
            raise ConfigError("spec_decode_speedup", "must be between 1 and 10")
        if self.gpu_utilization is not None and not 0.05 <= self.gpu_utilization <= 1.0:
            raise ConfigError("gpu_utilization", "must be between 0.05 and 1")
        if self.quantization not in QUANTIZATIONS:
            raise ConfigError("quantization", f"must be one of {', '.join(QUANTIZATIONS)}")

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> WhatIfRequest:
        def number(key: str, default: float | None) -> float | None:
            value = body.get(key)
            if value is None or value == "":
                return default
            if isinstance(value, bool) or not isinstance(value, int | float | str):
                raise ConfigError(key, "must be a number")
            try:
                return float(value)
            except ValueError as exc:
                raise ConfigError(key, "must be a number") from exc

        quantization = body.get("quantization") or "none"
        request = cls(
            cache_hit_rate_delta=number("cache_hit_rate_delta", 0.0) or 0.0,
            spec_decode_speedup=number("spec_decode_speedup", 1.0) or 1.0,
            gpu_utilization=number("gpu_utilization", None),
            quantization=str(quantization),
        )
        request.validate()
        return request


WhatIfEngine = Callable[..., dict[str, Any]]


def load_engine() -> WhatIfEngine | None:
    """The real what-if engine when its module is installed, else None."""
    try:
        module = importlib.import_module(WHATIF_MODULE)
    except ImportError:
        return None
    engine = getattr(module, WHATIF_FUNCTION, None)
    return engine if callable(engine) else None


def whatif_view(records: Sequence[RequestRecord], idle_cost_dollars: float,
                request: WhatIfRequest, engine: WhatIfEngine | None = None) -> dict[str, Any]:
    if engine is not None:
        quantization = None if request.quantization == "none" else request.quantization
        out = dict(engine(records, idle_cost_dollars,
                          cache_hit_rate_delta=request.cache_hit_rate_delta,
                          spec_decode_speedup=request.spec_decode_speedup,
                          gpu_utilization=request.gpu_utilization,
                          quantization=quantization))
        out.setdefault("engine", "roofline")
        out.setdefault("modeled", True)
        return out
    return fallback_projection(records, idle_cost_dollars, request)


def _gpu_phase_weights(records: Sequence[RequestRecord]) -> tuple[float, float]:
    """(prefill, decode) shares of GPU work: by cost when priced, else by engine seconds."""
    prefill = decode = 0.0
    for record in records:
        for stage in GPU_STAGES:
            timing = record.stages.get(stage)
            if timing is None:
                continue
            if Phase.PREFILL in timing.phases:
                prefill += timing.phases[Phase.PREFILL].cost_dollars
            if Phase.DECODE in timing.phases:
                decode += timing.phases[Phase.DECODE].cost_dollars
    if prefill + decode <= 0:
        prefill = sum(r.prefill_seconds or 0.0 for r in records)
        decode = sum(r.decode_seconds or 0.0 for r in records)
    total = prefill + decode
    if total <= 0:
        return 0.5, 0.5
    return prefill / total, decode / total


def _gpu_count(records: Sequence[RequestRecord]) -> int:
    """Distinct engine replicas seen, times their tensor-parallel degree (at least 1)."""
    replicas: dict[tuple[str | None, str | None], int] = {}
    for record in records:
        key = (record.node, record.engine)
        replicas[key] = max(replicas.get(key, 1), record.tensor_parallel)
    return max(1, sum(replicas.values()))


def fallback_projection(records: Sequence[RequestRecord], idle_cost_dollars: float,
                        request: WhatIfRequest) -> dict[str, Any]:
    """A first-order projection from the recorded prefill/decode split (not the roofline)."""
    report = build_report(records, idle_cost_dollars)
    prefill_w, decode_w = _gpu_phase_weights(records)
    hit = report.prefix_cache_hit_ratio or 0.0
    new_hit = min(1.0, max(0.0, hit + request.cache_hit_rate_delta))
    # Prefill work scales with the uncached share of input tokens.
    prefill_factor = (1.0 - new_hit) / (1.0 - hit) if hit < 1.0 else 1.0
    decode_factor = 1.0 / request.spec_decode_speedup
    quant_prefill, quant_decode = QUANTIZATION_FACTORS[request.quantization]
    prefill_factor *= quant_prefill
    decode_factor *= quant_decode
    work_factor = prefill_w * prefill_factor + decode_w * decode_factor

    attributed = report.cost_dollars
    measured_util = (attributed / (attributed + idle_cost_dollars)
                     if attributed + idle_cost_dollars > 0 and idle_cost_dollars > 0 else None)
    base_util = measured_util if measured_util is not None else DEFAULT_BASELINE_UTILIZATION
    new_util = request.gpu_utilization if request.gpu_utilization is not None else base_util
    # Node cost needed for the work = work cost / utilization.
    base_total = attributed + idle_cost_dollars
    node_cost_factor = work_factor * (base_util / new_util)

    gpus = _gpu_count(records)
    base_rps = (report.requests / report.window_seconds / gpus
                if report.window_seconds > 0 else None)
    proj_rps = (base_rps / work_factor * (new_util / base_util)
                if base_rps is not None and work_factor > 0 else None)

    prefill_total = sum(r.prefill_seconds or 0.0 for r in records)
    ttft_total = sum(r.ttft_seconds or 0.0 for r in records if r.ttft_seconds is not None)
    prefill_share_of_ttft = min(1.0, prefill_total / ttft_total) if ttft_total > 0 else 0.0
    base_ttft = report.ttft_p50_seconds
    proj_ttft = (base_ttft * (1.0 - prefill_share_of_ttft * (1.0 - prefill_factor))
                 if base_ttft is not None else None)

    # Unpriced records (no cost model configured) have no unit cost to project.
    base_cpm = report.cost_per_million_output_tokens if base_total > 0 else None
    proj_cpm = base_cpm * node_cost_factor if base_cpm is not None else None
    return {
        "engine": "fallback",
        "modeled": True,
        "note": "a first-order estimate from the recorded prefill/decode split; the roofline "
                "what-if engine is not installed",
        "inputs": {
            "cache_hit_rate_delta": request.cache_hit_rate_delta,
            "spec_decode_speedup": request.spec_decode_speedup,
            "gpu_utilization": request.gpu_utilization,
            "quantization": request.quantization,
        },
        "assumptions": [
            "prefill work scales with the uncached share of input tokens",
            "decode work divides by the speculative-decoding speedup",
            f"quantization multiplies (prefill, decode) work by "
            f"{QUANTIZATION_FACTORS[request.quantization]}",
            ("baseline GPU utilization measured from idle cost" if measured_util is not None
             else f"baseline GPU utilization assumed {DEFAULT_BASELINE_UTILIZATION:.0%} "
                  "(no idle cost recorded)"),
            f"GPUs counted from records: {gpus}",
        ],
        "baseline": {
            "requests": report.requests,
            "cost_per_million_output_tokens": base_cpm,
            "requests_per_second_per_gpu": base_rps,
            "ttft_p50_seconds": base_ttft,
            "prefix_cache_hit_ratio": report.prefix_cache_hit_ratio,
            "gpu_utilization": base_util,
            "cost_dollars": base_total,
        },
        "projected": {
            "cost_per_million_output_tokens": proj_cpm,
            "requests_per_second_per_gpu": proj_rps,
            "ttft_p50_seconds": proj_ttft,
            "prefix_cache_hit_ratio": new_hit if records else None,
            "gpu_utilization": new_util,
            "cost_dollars": base_total * node_cost_factor,
        },
    }
