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

SLO classes: each request keeps the outcome it was recorded with (the what-if knows the
records, not the classes' targets), so ``goodput_per_gpu`` is requests/s per GPU times the
share of requests that met their class's targets, and ``dollars_per_good_request`` the
projected dollars over those requests; both None when no request has a class.

A change in the prefix-cache hit ratio (``delta``, a fraction of the window's prompt
tokens: 0.10 is 10 percentage points) adds ``delta * sum(n + c)`` cached tokens, spread so
that every request gets the same share of its prompt until it reaches its cap, the rest
going to those with room left ("water-filling"). A request's cap is what a cache could
have served: the tokens of the deepest run of its prefix fingerprints an earlier request
in the window carried, or its recorded cache reads where more (all but its last prompt
token when it carries no fingerprints). The gain applied is ``min(delta, possible)``;
``what_if`` reports both.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokenpath import metric_names as M
from tokenpath.collector.cost.cache import DEFAULT_BLOCK_TOKENS, top_prefixes_by_waste
from tokenpath.collector.cost.catalog import catalog_model_name
from tokenpath.collector.cost.longcontext import spend_by_context_bucket
from tokenpath.collector.cost.prices import PriceSheet
from tokenpath.records import RequestRecord
from tokenpath.report import token_weighted_hit_ratio
from tokenpath.roofline import GPUS, MODELS, Roofline
from tokenpath.slo import OUTCOME_MET

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
    key: str = ""  # the record's id: what per-record cache gains are keyed by
    # the most prompt tokens a prefix cache could serve (repeatable_tokens)
    cacheable_tokens: int = 0
    # its SLO outcome as recorded (tokenpath/slo.py); None: no class
    slo_outcome: str | None = None


@dataclass(slots=True)
class Calibration:
    requests: list[_Request]
    decode_batch: float
    utilization: float
    factor: float
    hit_ratio: float
    window_seconds: float
    fingerprinted_requests: int = 0  # how many carry prefix fingerprints (the cap's basis)

    @property
    def cacheable_ratio(self) -> float:
        """The highest token-weighted hit ratio the window's repeats allow."""
        inputs = sum(r.input_tokens for r in self.requests)
        return sum(r.cacheable_tokens for r in self.requests) / inputs if inputs else 0.0

    @property
    def gpu_types(self) -> list[str]:
        return sorted({r.roofline.gpu.name for r in self.requests})

    @property
    def models(self) -> list[str]:
        return sorted({r.roofline.model.name for r in self.requests})

    def to_json(self) -> dict[str, Any]:
        """What the projections are calibrated on (``what_if``'s ``calibration``)."""
        return {
            "requests": len(self.requests),
            "decode_batch": self.decode_batch,
            "gpu_utilization": self.utilization,
            "model_to_measured_factor": self.factor,
            "prefix_cache_hit_ratio": self.hit_ratio,
            "cacheable_hit_ratio": self.cacheable_ratio,
            "fingerprinted_requests": self.fingerprinted_requests,
            "busy_window_seconds": self.window_seconds,
            "gpu_types": self.gpu_types,
            "models": self.models,
        }


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
    # SLO classes (the module's docstring): None when no request has a class
    goodput_per_gpu: float | None = None
    dollars_per_good_request: float | None = None

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


def repeatable_tokens(records: Sequence[RequestRecord],
                      block_tokens: int = DEFAULT_BLOCK_TOKENS) -> dict[str, int]:
    """Per record id, of those that carry prefix fingerprints: the prompt tokens of the
    deepest run of its fingerprints that an earlier request (in prefill order) carried:
    what a prefix cache large enough, and shared by every engine, could have served."""
    seen: set[str] = set()
    out: dict[str, int] = {}
    ordered = sorted((r for r in records if r.prefix_fingerprints),
                     key=lambda r: r.prefill_start_unix or r.start_unix)
    for record in ordered:
        depth = 0
        for fingerprint in record.prefix_fingerprints:
            if fingerprint not in seen:
                break
            depth += 1
        out[record.record_id] = depth * (record.prefix_block_tokens or block_tokens)
        seen.update(record.prefix_fingerprints)
    return out


def calibrate(records: Sequence[RequestRecord], prices: PriceSheet) -> Calibration:
    """Measured batch, utilization and model-to-measurement factor of a recorded workload."""
    usable = [r for r in records if r.complete and r.output_tokens > 0 and r.input_tokens > 0]
    if not usable:
        raise WhatIfError("no complete request with token counts to calibrate on")
    repeats = repeatable_tokens(records)
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
        cached = min(record.cache_read_tokens, record.input_tokens - 1)
        repeated = repeats.get(record.record_id)
        cacheable = (record.input_tokens - 1 if repeated is None
                     else max(cached, min(repeated, record.input_tokens - 1)))
        requests.append(_Request(roofline, price, record.input_tokens, cached,
                                 record.output_tokens, record.ttft_seconds, prefill or 0.0,
                                 record.record_id, cacheable, record.slo_outcome))
    busy_total = sum(_union_seconds(v) for v in busy.values())
    window_total = sum(max(e for _, e in v) - min(s for s, _ in v) for v in busy.values())
    batch = max(1.0, sum(decode_sum.values()) / busy_total) if busy_total > 0 else 1.0
    utilization = busy_total / window_total if window_total > 0 else 1.0
    calibration = Calibration(requests, batch, max(utilization, 1e-6), 1.0,
                              token_weighted_hit_ratio(usable) or 0.0, window_total,
                              sum(1 for r in usable if r.record_id in repeats))
    measured = sum(r.gpu_cost_dollars / (req.dollars_per_gpu_second * req.roofline.tensor_parallel)
                   for r, req in zip(usable, requests, strict=True))
    base = _plan(calibration, Scenario())
    modeled = sum(p + d for p, d in (_gpu_seconds(req, step, calibration, Scenario())
                                     for req, step in zip(requests, base, strict=True)))
    if measured > 0 and modeled > 0:
        calibration.factor = measured / modeled
    return calibration


@dataclass(frozen=True, slots=True)
class _Step:
    """One request under a scenario: the roofline it runs on, its prompt, its cached part."""

    roofline: Roofline
    input_tokens: int
    cached_tokens: int


def _spread(gains_room: list[tuple[int, int]], total: float) -> list[int]:
    """Water-filling: ``total`` tokens over requests given as (prompt tokens, room), each
    taking the same share ``t`` of its prompt until its room is full, in whole tokens
    (largest remainders rounded up, so they add up to ``round(total)``)."""
    if total <= 0 or not gains_room:
        return [0] * len(gains_room)
    room_total = sum(room for _, room in gains_room)
    if room_total <= total:
        return [room for _, room in gains_room]
    order = sorted(range(len(gains_room)),
                   key=lambda i: gains_room[i][1] / max(1, gains_room[i][0]))
    left, prompts = total, float(sum(max(1, n) for n, _ in gains_room))
    share = 0.0
    for i in order:
        n, room = gains_room[i]
        share = left / prompts if prompts > 0 else 0.0
        if room >= share * max(1, n):
            break
        left -= room
        prompts -= max(1, n)
    exact = [min(float(room), share * max(1, n)) for n, room in gains_room]
    # whole tokens, the largest remainders rounded up: the total stays round(total)
    out = [math.floor(x) for x in exact]
    short = round(min(total, float(room_total))) - sum(out)
    by_remainder = sorted(range(len(exact)), key=lambda i: out[i] - exact[i])
    for i in by_remainder[:max(0, short)]:
        if out[i] < gains_room[i][1]:
            out[i] += 1
    return out


def _plan(calibration: Calibration, scenario: Scenario,
          cached_gains: Mapping[str, int] | None = None) -> list[_Step]:
    """Every request's roofline, prompt and cached tokens under ``scenario``.

    ``cached_gains`` (cached tokens added per record id, e.g. a routing replay's) replaces
    the scenario's uniform hit-ratio change."""
    rooflines: dict[int, Roofline] = {}
    base: list[tuple[Roofline, int, int, int]] = []
    for req in calibration.requests:
        roofline = req.roofline
        if scenario.quantization is not None:
            cached_roofline = rooflines.get(id(roofline))
            if cached_roofline is None:
                weight_bytes, kv_bytes = QUANTIZATION[scenario.quantization]
                model = dataclasses.replace(roofline.model, bytes_per_param=weight_bytes,
                                            kv_bytes_per_element=kv_bytes)
                cached_roofline = dataclasses.replace(roofline, model=model)
                rooflines[id(roofline)] = cached_roofline
            roofline = cached_roofline
        input_tokens = max(1, round(req.input_tokens * scenario.context_scale))
        cached = 0 if scenario.disable_cache else round(req.cached_tokens
                                                        * scenario.context_scale)
        cached = min(max(0, cached), input_tokens - 1)
        cacheable = min(input_tokens - 1,
                        max(cached, round(req.cacheable_tokens * scenario.context_scale)))
        base.append((roofline, input_tokens, cached, cacheable))
    if cached_gains is not None:
        return [_Step(roofline, n, min(max(0, c + cached_gains.get(req.key, 0)), n - 1))
                for req, (roofline, n, c, _) in zip(calibration.requests, base, strict=True)]
    delta = scenario.cache_hit_rate_delta
    total = abs(delta) * sum(n for _, n, _, _ in base)
    if delta >= 0:
        moved = _spread([(n, cap - c) for _, n, c, cap in base], total)
        return [_Step(roofline, n, c + g) for (roofline, n, c, _), g in zip(base, moved,
                                                                           strict=True)]
    moved = _spread([(n, c) for _, n, c, _ in base], total)
    return [_Step(roofline, n, c - g) for (roofline, n, c, _), g in zip(base, moved,
                                                                       strict=True)]


def _prefill_seconds(roofline: Roofline, input_tokens: int, cached: int, batch: float) -> float:
    new = max(1, input_tokens - cached)
    compute = roofline.compute_seconds(roofline.prefill_flops(new, cached))
    memory = roofline.memory_seconds(roofline.prefill_bytes(new, cached)
                                     + roofline.model.weight_bytes / batch)
    return max(compute, memory)


def _gpu_seconds(req: _Request, step: _Step, calibration: Calibration,
                 scenario: Scenario) -> tuple[float, float]:
    """(prefill, decode) modeled GPU share-seconds of one request as planned in ``step``."""
    roofline, input_tokens, cached = step.roofline, step.input_tokens, step.cached_tokens
    batch = calibration.decode_batch
    prefill = _prefill_seconds(roofline, input_tokens, cached, batch)
    ctx = input_tokens + req.output_tokens // 2
    step_seconds = max(batch * roofline.compute_seconds(roofline.decode_flops(ctx)),
                       roofline.memory_seconds(roofline.model.weight_bytes
                                               + batch * roofline.decode_bytes(ctx)))
    step_seconds += roofline.step_overhead_seconds + roofline.nvlink_seconds(max(1, round(batch)))
    decode = (max(0, req.output_tokens - 1) * step_seconds / batch
              / scenario.spec_decode_speedup)
    return prefill, decode


def project(calibration: Calibration, scenario: Scenario,
            cached_gains: Mapping[str, int] | None = None) -> Projection:
    """The workload's cost, throughput and TTFT under ``scenario`` (``Scenario()`` = baseline);
    ``cached_gains``: cached tokens added per record id instead of the scenario's hit-ratio
    change (the routing what-if's replay)."""
    scenario.validate()
    utilization = scenario.gpu_utilization or calibration.utilization
    k = calibration.factor
    cost = gpu_seconds = prefill_total = decode_total = 0.0
    output_tokens = cached_tokens = input_tokens = 0
    ttfts: list[float] = []
    classified = good = 0
    plan = _plan(calibration, scenario, cached_gains)
    for req, step in zip(calibration.requests, plan, strict=True):
        prefill, decode = _gpu_seconds(req, step, calibration, scenario)
        gpus = req.roofline.tensor_parallel
        seconds = k * (prefill + decode) * gpus
        gpu_seconds += seconds
        prefill_total += k * prefill * gpus
        decode_total += k * decode * gpus
        cost += seconds * req.dollars_per_gpu_second / utilization
        output_tokens += req.output_tokens
        input_tokens += step.input_tokens
        cached_tokens += step.cached_tokens
        if req.slo_outcome is not None:
            classified += 1
            good += req.slo_outcome == OUTCOME_MET
        if req.ttft_seconds is not None:
            base_prefill = _prefill_seconds(req.roofline, req.input_tokens, req.cached_tokens,
                                            calibration.decode_batch)
            ratio = prefill / base_prefill if base_prefill > 0 else 1.0
            ttfts.append(max(0.0, req.ttft_seconds - req.prefill_measured * (1 - ratio)))
    per_gpu = (utilization * len(calibration.requests) / gpu_seconds
               if gpu_seconds > 0 else 0.0)
    return Projection(
        cost_per_million_output_tokens=cost / output_tokens * 1e6 if output_tokens else 0.0,
        requests_per_second_per_gpu=per_gpu,
        ttft_p50_seconds=statistics.median(ttfts) if ttfts else None,
        gpu_utilization=utilization,
        prefix_cache_hit_ratio=cached_tokens / input_tokens if input_tokens else 0.0,
        cost_dollars=cost,
        prefill_gpu_seconds=prefill_total,
        decode_gpu_seconds=decode_total,
        goodput_per_gpu=per_gpu * good / len(calibration.requests) if classified else None,
        dollars_per_good_request=cost / good if classified and good else None,
    )


def _change(baseline: Projection, projected: Projection) -> dict[str, float | None]:
    """Relative changes (0.1 = 10 % more) of the dollars, throughput and latency."""
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
        "goodput_per_gpu": rel(baseline.goodput_per_gpu, projected.goodput_per_gpu),
        "dollars_per_good_request": rel(baseline.dollars_per_good_request,
                                        projected.dollars_per_good_request),
    }


def _change_pp(baseline: Projection, projected: Projection) -> dict[str, float]:
    """Changes of the ratios, in percentage points (10.0 = ten points more)."""
    return {
        "prefix_cache_hit_ratio": (projected.prefix_cache_hit_ratio
                                   - baseline.prefix_cache_hit_ratio) * 100,
        "gpu_utilization": (projected.gpu_utilization - baseline.gpu_utilization) * 100,
    }


def cache_limit(calibration: Calibration, baseline: Projection, projected: Projection,
                asked: float) -> dict[str, Any]:
    """The hit-ratio change asked (a fraction), what the window's repeats allow, and what
    the projection applied; ``capped`` when it applied less than asked."""
    possible = calibration.cacheable_ratio - baseline.prefix_cache_hit_ratio
    applied = projected.prefix_cache_hit_ratio - baseline.prefix_cache_hit_ratio
    return {
        "asked_delta": asked,
        "possible_delta": possible,
        "applied_delta": applied,
        "cacheable_hit_ratio": calibration.cacheable_ratio,
        # rounding to whole tokens moves the applied change by far less than this
        "capped": asked > 0 and applied < asked - 1e-4,
        "basis": ("prefix fingerprints: the tokens of the deepest prefix an earlier request "
                  "in the window carried, or the recorded cache reads where more"
                  if calibration.fingerprinted_requests else
                  "no prefix fingerprints recorded: every prompt token but the last"),
    }


def project_json(calibration: Calibration, baseline: Projection, scenario: Scenario,
                 cached_gains: Mapping[str, int] | None = None) -> dict[str, Any]:
    """One scenario's projection beside the baseline: ``{baseline, projected, change
    (relative), change_pp (percentage points), cache_hit_rate, scenario}``."""
    projected = project(calibration, scenario, cached_gains)
    return {
        "provenance": "modeled",
        "baseline": baseline.to_json(),
        "projected": projected.to_json(),
        "change": _change(baseline, projected),
        "change_pp": _change_pp(baseline, projected),
        "cache_hit_rate": cache_limit(calibration, baseline, projected,
                                      scenario.cache_hit_rate_delta),
        "scenario": dataclasses.asdict(scenario),
    }


def what_if(records: Sequence[RequestRecord], prices: PriceSheet,
            scenario: Scenario, cached_gains: Mapping[str, int] | None = None,
            calibration: Calibration | None = None) -> dict[str, Any]:
    """``tokenpath whatif --format json``: ``{baseline, projected, change, change_pp,
    cache_hit_rate, calibration, ...}``. ``change`` is relative (0.1 = 10 % more),
    ``change_pp`` in percentage points. ``cached_gains``: see :func:`project`."""
    if calibration is None:
        calibration = calibrate(records, prices)
    out = project_json(calibration, project(calibration, Scenario()), scenario, cached_gains)
    out["long_context"] = [b.to_json() for b in spend_by_context_bucket(records)]
    out["top_prefixes_by_waste"] = [dataclasses.asdict(p)
                                    for p in top_prefixes_by_waste(records)]
    out["calibration"] = calibration.to_json()
    return out
