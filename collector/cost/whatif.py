"""The what-if engine: the attribution roofline, calibrated on recorded requests.

For each recorded request ``i`` (``n`` new prefill tokens after ``c`` cached, ``o`` output
tokens, context ``ctx = input + o/2`` on average), GPU share-seconds are modeled as

    prefill_i = max(Cp(n, c), Mp(n, c) + W/B)
    decode_i  = (o - 1) * (max(B * Cd(ctx), W + B * Md(ctx)) + overhead) / B / s

with ``Cp, Mp`` the prefill compute and memory seconds (attention term included), ``Cd,
Md`` one decode token's, ``W`` the weight-streaming time, ``B`` the measured average decode
batch and ``s`` the speculative decoding speedup. A calibration factor ``k`` (measured
attributed GPU seconds / modeled) carries the model onto the recorded numbers. Then

    cost                 = k * sum(gpu_seconds_i) * tp * $/GPU-second / U
    cost per M output    = cost / sum(o) * 1e6
    requests/s per GPU   = U * N / (k * sum(gpu_seconds_i) * tp)
    ttft_i'              = ttft_i - prefill_measured_i * (1 - prefill_i(proj) / prefill_i(base))

``U`` is the GPU utilization (busy time / window, measured per node). Everything here is
modeled; formulas and assumptions are in docs/cost-model.md.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenpath import metric_names as M
from tokenpath.collector.cost.cache import top_prefixes_by_waste
from tokenpath.collector.cost.catalog import catalog_model_name
from tokenpath.collector.cost.longcontext import spend_by_context_bucket
from tokenpath.collector.cost.prices import PriceSheet
from tokenpath.records import RequestRecord
from tokenpath.report import token_weighted_hit_ratio
from tokenpath.roofline import GPUS, MODELS, Roofline

# Speculative decoding: cost of one draft token relative to one target decode step.
DRAFT_COST_RATIO = 0.05
DEFAULT_SPEC_ACCEPTANCE = 0.7
DEFAULT_SPEC_DRAFT_TOKENS = 4
FALLBACK_MODEL = "llama-3.1-8b"

# (weight bytes per parameter, KV-cache bytes per element)
QUANTIZATION: dict[str, tuple[float, float]] = {
    "bf16": (2.0, 2.0),
    "int8": (1.0, 1.0),  # W8A8 / FP8 weights, FP8 KV cache
    "int4": (0.5, 1.0),  # AWQ/GPTQ-style 4-bit weights, KV cache kept in FP8
}


class WhatIfError(ValueError):
    """The scenario or the recorded workload cannot be projected."""


def speculative_speedup(acceptance: float, draft_tokens: int,
                        draft_cost_ratio: float = DRAFT_COST_RATIO) -> float:
    """Expected decode speedup: tokens per verify step (Leviathan et al., 2023, eq. 1)
    ``(1 - a^(k+1)) / (1 - a)`` over the step's cost ``1 + k * draft_cost_ratio``."""
    if not 0 <= acceptance < 1:
        raise WhatIfError("spec decode acceptance rate must be in [0, 1)")
    if draft_tokens < 1:
        raise WhatIfError("spec decode draft length must be >= 1")
    tokens = (1 - acceptance ** (draft_tokens + 1)) / (1 - acceptance)
    return tokens / (1 + draft_tokens * draft_cost_ratio)


@dataclass(frozen=True, slots=True)
class Scenario:
    """What changes. ``None`` keeps the recorded value."""

    cache_hit_rate_delta: float = 0.0
    spec_decode_speedup: float = 1.0
    gpu_utilization: float | None = None
    quantization: str | None = None
    context_scale: float = 1.0  # multiplies every prompt (long-context rule of thumb)
    disable_cache: bool = False

    def validate(self) -> None:
        if self.spec_decode_speedup <= 0:
            raise WhatIfError("--spec-decode-speedup must be > 0")
        if self.gpu_utilization is not None and not 0 < self.gpu_utilization <= 1:
            raise WhatIfError("--gpu-utilization must be in (0, 1]")
        if self.quantization is not None and self.quantization not in QUANTIZATION:
            raise WhatIfError(f"--quantization must be one of {', '.join(QUANTIZATION)}")
        if not -1 <= self.cache_hit_rate_delta <= 1:
            raise WhatIfError("--cache-hit-rate change must be within [-1, 1]")
        if self.context_scale <= 0:
            raise WhatIfError("context scale must be > 0")


@dataclass(frozen=True, slots=True)
class _Request:
    roofline: Roofline
    dollars_per_gpu_second: float
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    ttft_seconds: float | None
    prefill_measured: float


@dataclass(slots=True)
class Calibration:
    requests: list[_Request]
    decode_batch: float
    utilization: float
    factor: float
    hit_ratio: float
    window_seconds: float


@dataclass(frozen=True, slots=True)
class Projection:
    cost_per_million_output_tokens: float
    requests_per_second_per_gpu: float
    ttft_p50_seconds: float | None
    gpu_utilization: float
    prefix_cache_hit_ratio: float
    cost_dollars: float
    prefill_gpu_seconds: float
    decode_gpu_seconds: float

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _roofline(record: RequestRecord, prices: PriceSheet) -> tuple[Roofline, float]:
    spec = prices.node_spec(record.node)
    gpu = spec.gpu_type or record.gpu_type or prices.default_gpu_type
    if gpu not in GPUS:
        gpu = prices.default_gpu_type if prices.default_gpu_type in GPUS else "H100-SXM"
    model = catalog_model_name(record.model) or FALLBACK_MODEL
    roofline = Roofline(GPUS[gpu], MODELS[model], tensor_parallel=max(1, record.tensor_parallel))
    return roofline, prices.gpu_price(gpu).dollars_per_second


def _union_seconds(intervals: list[tuple[float, float]]) -> float:
    total, current_start, current_end = 0.0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None and current_start is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None and current_start is not None:
        total += current_end - current_start
    return total


def calibrate(records: Sequence[RequestRecord], prices: PriceSheet) -> Calibration:
    """Measured batch, utilization and model-to-measurement factor of a recorded workload."""
    usable = [r for r in records if r.complete and r.output_tokens > 0 and r.input_tokens > 0]
    if not usable:
        raise WhatIfError("no complete request with token counts to calibrate on")
    requests: list[_Request] = []
    busy: dict[str, list[tuple[float, float]]] = defaultdict(list)
    decode_sum: dict[str, float] = defaultdict(float)
    for record in usable:
        roofline, price = _roofline(record, prices)
        ps, ds, end = record.prefill_start_unix, record.decode_start_unix, record.engine_end_unix
        prefill = record.prefill_seconds
        if ps is not None and ds is not None and end is not None and ps <= ds <= end:
            node = record.node or M.UNKNOWN
            busy[node].append((ps, end))
            decode_sum[node] += end - ds
            prefill = ds - ps if prefill is None else prefill
        requests.append(_Request(roofline, price, record.input_tokens,
                                 min(record.cache_read_tokens, record.input_tokens - 1),
                                 record.output_tokens, record.ttft_seconds, prefill or 0.0))
    busy_total = sum(_union_seconds(v) for v in busy.values())
    window_total = sum(max(e for _, e in v) - min(s for s, _ in v) for v in busy.values())
    batch = max(1.0, sum(decode_sum.values()) / busy_total) if busy_total > 0 else 1.0
    utilization = busy_total / window_total if window_total > 0 else 1.0
    calibration = Calibration(requests, batch, max(utilization, 1e-6), 1.0,
                              token_weighted_hit_ratio(usable) or 0.0, window_total)
    measured = sum(r.gpu_cost_dollars / (req.dollars_per_gpu_second * req.roofline.tensor_parallel)
                   for r, req in zip(usable, requests, strict=True))
    modeled = sum(p + d for p, d in (_gpu_seconds(req, calibration, Scenario())
                                     for req in requests))
    if measured > 0 and modeled > 0:
        calibration.factor = measured / modeled
    return calibration


def _apply(req: _Request, calibration: Calibration,
           scenario: Scenario) -> tuple[Roofline, int, int]:
    roofline = req.roofline
    if scenario.quantization is not None:
        weight_bytes, kv_bytes = QUANTIZATION[scenario.quantization]
        model = dataclasses.replace(roofline.model, bytes_per_param=weight_bytes,
                                    kv_bytes_per_element=kv_bytes)
        roofline = dataclasses.replace(roofline, model=model)
    input_tokens = max(1, round(req.input_tokens * scenario.context_scale))
    cached = 0 if scenario.disable_cache else round(req.cached_tokens * scenario.context_scale)
    cached += round(scenario.cache_hit_rate_delta * input_tokens)
    cached = min(max(0, cached), input_tokens - 1)
    return roofline, input_tokens, cached


def _prefill_seconds(roofline: Roofline, input_tokens: int, cached: int, batch: float) -> float:
    new = max(1, input_tokens - cached)
    compute = roofline.compute_seconds(roofline.prefill_flops(new, cached))
    memory = roofline.memory_seconds(roofline.prefill_bytes(new, cached)
                                     + roofline.model.weight_bytes / batch)
    return max(compute, memory)


def _gpu_seconds(req: _Request, calibration: Calibration,
                 scenario: Scenario) -> tuple[float, float]:
    """(prefill, decode) modeled GPU share-seconds of one request under ``scenario``."""
    roofline, input_tokens, cached = _apply(req, calibration, scenario)
    batch = calibration.decode_batch
    prefill = _prefill_seconds(roofline, input_tokens, cached, batch)
    ctx = input_tokens + req.output_tokens // 2
    step = max(batch * roofline.compute_seconds(roofline.decode_flops(ctx)),
               roofline.memory_seconds(roofline.model.weight_bytes
                                       + batch * roofline.decode_bytes(ctx)))
    step += roofline.step_overhead_seconds + roofline.nvlink_seconds(max(1, round(batch)))
    decode = max(0, req.output_tokens - 1) * step / batch / scenario.spec_decode_speedup
    return prefill, decode


def project(calibration: Calibration, scenario: Scenario) -> Projection:
    """The workload's cost, throughput and TTFT under ``scenario`` (``Scenario()`` = baseline)."""
    scenario.validate()
    utilization = scenario.gpu_utilization or calibration.utilization
    k = calibration.factor
    cost = gpu_seconds = prefill_total = decode_total = 0.0
    output_tokens = cached_tokens = input_tokens = 0
    ttfts: list[float] = []
    for req in calibration.requests:
        prefill, decode = _gpu_seconds(req, calibration, scenario)
        gpus = req.roofline.tensor_parallel
        seconds = k * (prefill + decode) * gpus
        gpu_seconds += seconds
        prefill_total += k * prefill * gpus
        decode_total += k * decode * gpus
        cost += seconds * req.dollars_per_gpu_second / utilization
        output_tokens += req.output_tokens
        _, inputs, cached = _apply(req, calibration, scenario)
        input_tokens += inputs
        cached_tokens += cached
        if req.ttft_seconds is not None:
            base_prefill = _prefill_seconds(req.roofline, *_apply(req, calibration, Scenario())[1:],
                                            calibration.decode_batch)
            ratio = prefill / base_prefill if base_prefill > 0 else 1.0
            ttfts.append(max(0.0, req.ttft_seconds - req.prefill_measured * (1 - ratio)))
    return Projection(
        cost_per_million_output_tokens=cost / output_tokens * 1e6 if output_tokens else 0.0,
        requests_per_second_per_gpu=(utilization * len(calibration.requests) / gpu_seconds
                                     if gpu_seconds > 0 else 0.0),
        ttft_p50_seconds=statistics.median(ttfts) if ttfts else None,
        gpu_utilization=utilization,
        prefix_cache_hit_ratio=cached_tokens / input_tokens if input_tokens else 0.0,
        cost_dollars=cost,
        prefill_gpu_seconds=prefill_total,
        decode_gpu_seconds=decode_total,
    )


def _change(baseline: Projection, projected: Projection) -> dict[str, float | None]:
    def rel(a: float | None, b: float | None) -> float | None:
        if a is None or b is None or a == 0:
            return None
        return b / a - 1.0

    return {
        "cost_per_million_output_tokens": rel(baseline.cost_per_million_output_tokens,
                                              projected.cost_per_million_output_tokens),
        "requests_per_second_per_gpu": rel(baseline.requests_per_second_per_gpu,
                                           projected.requests_per_second_per_gpu),
        "ttft_p50_seconds": rel(baseline.ttft_p50_seconds, projected.ttft_p50_seconds),
    }


def what_if(records: Sequence[RequestRecord], prices: PriceSheet,
            scenario: Scenario) -> dict[str, Any]:
    """``tokenpath whatif --format json``: ``{baseline, projected, change, calibration}``."""
    calibration = calibrate(records, prices)
    baseline = project(calibration, Scenario())
    projected = project(calibration, scenario)
    return {
        "provenance": "modeled",
        "baseline": baseline.to_json(),
        "projected": projected.to_json(),
        "change": _change(baseline, projected),
        "scenario": dataclasses.asdict(scenario),
        "long_context": [b.to_json() for b in spend_by_context_bucket(records)],
        "top_prefixes_by_waste": [dataclasses.asdict(p) for p in top_prefixes_by_waste(records)],
        "calibration": {
            "requests": len(calibration.requests),
            "decode_batch": calibration.decode_batch,
            "gpu_utilization": calibration.utilization,
            "model_to_measured_factor": calibration.factor,
            "prefix_cache_hit_ratio": calibration.hit_ratio,
        },
    }
