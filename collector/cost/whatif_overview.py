"""The what-if page's projections, and the one way scenarios are composed for the CLI and API.

``tokenpath whatif``, ``POST /api/whatif`` (the page's form) and ``GET /api/whatif`` (what
the page opens with) all run :func:`run_whatif` over the same records, so the same window
gives the same numbers everywhere. The window is ``since`` (a duration) counted back from
``until`` (unix seconds; now when not given): ``until`` fixes the window's end, so a page
opened at one time and a command run later can read the same requests.

:func:`whatif_overview` reads the window once, calibrates once and projects the scenarios
that matter for a platform engineer: a prefix-affine router (its replay and the roofline at
the replay's hits), a prefix-cache hit ratio 10 points higher, speculative decoding at 2x
decode and int8 weights and KV cache. Every figure is modeled; each scenario says what it
is calibrated on.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenpath.collector.cost.prices import PriceSheet
from tokenpath.collector.cost.routing_whatif import RoutingWhatIf, prefix_affine_whatif
from tokenpath.collector.cost.whatif import (
    DEFAULT_SPEC_DRAFT_TOKENS,
    QUANTIZATION,
    Calibration,
    Scenario,
    WhatIfError,
    calibrate,
    project,
    project_json,
    speculative_speedup,
    what_if,
)
from tokenpath.config import ConfigError, parse_duration
from tokenpath.records import RequestRecord

DEFAULT_CACHE_HIT_RATE_DELTA = 0.10  # ten percentage points
DEFAULT_SPEC_DECODE_SPEEDUP = 2.0
DEFAULT_QUANTIZATION = "int8"
PREFIX_AFFINE = "prefix_affine"


@dataclass(frozen=True, slots=True)
class WhatIfWindow:
    """The requests that ended in ``[since_unix, until_unix]`` (no start with no ``since``)."""

    since: str | None
    since_unix: float | None
    until_unix: float

    @classmethod
    def resolve(cls, since: str | None, until: float | None,
                now: float | None = None) -> WhatIfWindow:
        """``since`` (a duration such as ``1h``) counts back from ``until`` (unix seconds),
        or from now. Errors name ``since`` or ``until``."""
        if until is not None and (isinstance(until, bool) or not math.isfinite(until)):
            raise ConfigError("until", f"must be a finite unix time, not {until!r}")
        end = (time.time() if now is None else now) if until is None else float(until)
        start = None if since is None else end - parse_duration(since, "since")
        return cls(since, start, end)

    def to_json(self) -> dict[str, Any]:
        return {"since": self.since, "since_unix": self.since_unix,
                "until_unix": self.until_unix}

    def cli_flags(self) -> list[str]:
        """The ``tokenpath whatif`` flags that read this window again."""
        flags = ["--since", self.since] if self.since is not None else []
        return [*flags, "--until", repr(self.until_unix)]


def run_whatif(records: Sequence[RequestRecord], prices: PriceSheet, scenario: Scenario,
               router: str | None = None, explicit_cache_change: bool = False,
               calibration: Calibration | None = None,
               routing: RoutingWhatIf | None = None) -> dict[str, Any]:
    """``tokenpath whatif --format json``: the scenario's projection; with ``router``
    (``prefix_affine``), the router's replay under ``routing`` and, unless the cache change
    was given (``explicit_cache_change``), the projection at the replay's per-request hits.
    Raises :class:`WhatIfError` when the window cannot be projected."""
    gains = None
    if router is not None:
        if router.replace("-", "_") != PREFIX_AFFINE:
            raise WhatIfError(f"router {router!r}: the one router modeled is prefix-affine")
        if routing is None:
            routing = prefix_affine_whatif(records)
        if not explicit_cache_change and routing.hit_ratio_gain is not None:
            gains = routing.gains
            scenario = _with_cache_change(scenario, routing.hit_ratio_gain)
    scenario.validate()
    result = what_if(records, prices, scenario, gains, calibration)
    if router is not None and routing is not None:
        result["routing"] = routing.to_json()
    return result


def _with_cache_change(scenario: Scenario, delta: float) -> Scenario:
    return Scenario(cache_hit_rate_delta=delta, spec_decode_speedup=scenario.spec_decode_speedup,
                    gpu_utilization=scenario.gpu_utilization, quantization=scenario.quantization,
                    context_scale=scenario.context_scale, disable_cache=scenario.disable_cache)


def _acceptance_for(speedup: float, draft_tokens: int = DEFAULT_SPEC_DRAFT_TOKENS) -> float | None:
    """The draft acceptance rate at which ``speculative_speedup`` reaches ``speedup``."""
    low, high = 0.0, 0.999
    if speculative_speedup(high, draft_tokens) < speedup:
        return None
    for _ in range(50):
        middle = (low + high) / 2
        if speculative_speedup(middle, draft_tokens) < speedup:
            low = middle
        else:
            high = middle
    return high


def _pct(value: float) -> str:
    return f"{value * 100:.1f}%"


def calibration_text(calibration: Calibration) -> str:
    """What the roofline is calibrated on, in words."""
    on = ", ".join(f"{g}" for g in calibration.gpu_types)
    models = ", ".join(calibration.models)
    return (f"the roofline of {models} on {on}, calibrated on {len(calibration.requests)} "
            f"complete requests of the window: measured decode batch "
            f"{calibration.decode_batch:.2f}, GPU utilization {_pct(calibration.utilization)} "
            f"(busy time over the busy window, per node), and the model's GPU seconds scaled "
            f"x{calibration.factor:.3g} to the attributed ones")


def _routing_text(routing: RoutingWhatIf) -> str:
    replayed = routing.replayed_hit_ratio or 0.0
    recorded = routing.recorded_hit_ratio or 0.0
    engines = f"{routing.engines} engine{'' if routing.engines == 1 else 's'}"
    return (f"the prefix fingerprints of {routing.requests} requests on {engines} "
            f"replayed in prefill order, each engine an LRU of "
            f"{routing.capacity_blocks:,} blocks: the capacity fitted so that the replay on "
            f"the recorded routing gives the recorded hits ({_pct(replayed)} replayed, "
            f"{_pct(recorded)} recorded); the router sends each request to the engine "
            f"rendezvous hashing picks for its first block; cost and TTFT from the roofline "
            f"at each request's replayed hits")


def _scenario_entry(id_: str, title: str, flags: list[str], request: dict[str, Any],
                    calibrated_on: str, projection: dict[str, Any] | None,
                    unavailable: str | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": id_, "title": title, "provenance": "modeled",
                             "cli_flags": flags, "request": request,
                             "calibrated_on": calibrated_on, "unavailable": unavailable}
    if projection is not None:
        entry.update(projection)
    return entry


def whatif_overview(records: Sequence[RequestRecord], prices: PriceSheet,
                    window: WhatIfWindow) -> dict[str, Any]:
    """``GET /api/whatif``: the window, what the model is calibrated on, the baseline and
    the default scenarios (``scenarios``, each shaped like ``tokenpath whatif --format
    json`` with the flags named in ``cli_flags``). An empty or unusable window answers with
    ``unavailable`` set and no scenarios."""
    out: dict[str, Any] = {"provenance": "modeled", "engine": "roofline",
                           "window": {**window.to_json(), "records": len(records)},
                           "cli_flags": window.cli_flags(), "unavailable": None,
                           "calibration": None, "calibrated_on": None, "baseline": None,
                           "scenarios": []}
    try:
        calibration = calibrate(records, prices)
    except WhatIfError as exc:
        out["unavailable"] = str(exc)
        return out
    baseline = project(calibration, Scenario())
    roofline_text = calibration_text(calibration)
    out.update(calibration=calibration.to_json(), calibrated_on=roofline_text,
               baseline=baseline.to_json())
    scenarios: list[dict[str, Any]] = []

    routing = prefix_affine_whatif(records)
    routed = None
    unavailable = None
    if routing.hit_ratio_gain is None:
        unavailable = ("no request in the window carries prefix fingerprints and an "
                       "engine: the routing what-if replays them")
    else:
        routed = run_whatif(records, prices, Scenario(), PREFIX_AFFINE,
                            calibration=calibration, routing=routing)
        for key in ("long_context", "top_prefixes_by_waste", "calibration"):
            routed.pop(key, None)
    scenarios.append(_scenario_entry(
        PREFIX_AFFINE, "Prefix-affine routing", ["--router", "prefix-affine"],
        {"router": PREFIX_AFFINE},
        _routing_text(routing) if unavailable is None else roofline_text, routed,
        unavailable))

    delta = DEFAULT_CACHE_HIT_RATE_DELTA
    scenarios.append(_scenario_entry(
        "cache", f"Prefix-cache hit ratio +{delta * 100:g} pp",
        ["--cache-hit-rate", f"+{delta:.2f}"], {"cache_hit_rate_delta": delta},
        f"{roofline_text}; the added cached tokens spread over the requests as an equal "
        f"share of each prompt, none past what its repeats allow",
        project_json(calibration, baseline, Scenario(cache_hit_rate_delta=delta))))

    speedup = DEFAULT_SPEC_DECODE_SPEEDUP
    acceptance = _acceptance_for(speedup)
    scenarios.append(_scenario_entry(
        "spec_decode", f"Speculative decoding, {speedup:g}x decode",
        ["--spec-decode-speedup", f"{speedup:g}"], {"spec_decode_speedup": speedup},
        f"{roofline_text}; each request's decode steps at the measured batch take "
        f"{speedup:g}x less GPU time, prefill unchanged"
        + (f" (about draft acceptance {acceptance:.2f} with {DEFAULT_SPEC_DRAFT_TOKENS} "
           f"draft tokens)" if acceptance is not None else ""),
        project_json(calibration, baseline, Scenario(spec_decode_speedup=speedup))))

    quant = DEFAULT_QUANTIZATION
    weight_bytes, kv_bytes = QUANTIZATION[quant]
    scenarios.append(_scenario_entry(
        quant, f"{quant} weights and KV cache", ["--quantization", quant],
        {"quantization": quant},
        f"{roofline_text}; weights at {weight_bytes:g} byte per parameter and the KV cache "
        f"at {kv_bytes:g} byte per element instead of 2: memory-bound steps read fewer "
        f"bytes; accuracy not modeled",
        project_json(calibration, baseline, Scenario(quantization=quant))))
    out["scenarios"] = scenarios
    return out
