"""POST /api/whatif: the UI's what-if form over the same engine as ``tokenpath whatif``.

Parses and validates the form (errors name the field), then calls
:func:`tokenpath.collector.cost.whatif.what_if` on the recorded requests: the roofline
model calibrated on them. Every figure it returns is modeled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenpath.collector.cost.prices import PriceSheet
from tokenpath.collector.cost.routing_whatif import prefix_affine_whatif
from tokenpath.collector.cost.whatif import Scenario, WhatIfError, what_if
from tokenpath.config import ConfigError
from tokenpath.records import RequestRecord

QUANTIZATIONS = ("none", "int8", "int4")
ROUTERS = ("as_recorded", "prefix_affine")


@dataclass(frozen=True, slots=True)
class WhatIfRequest:
    cache_hit_rate_delta: float = 0.0
    spec_decode_speedup: float = 1.0
    gpu_utilization: float | None = None
    quantization: str = "none"
    # prefix_affine: replay the fingerprints through a prefix-affine router
    # (collector/cost/routing_whatif.py) and project with its cache-hit gain
    router: str = "as_recorded"

    def validate(self) -> None:
        if not -1.0 <= self.cache_hit_rate_delta <= 1.0:
            raise ConfigError("cache_hit_rate_delta", "must be between -1 and 1")
        if not 1.0 <= self.spec_decode_speedup <= 10.0:
            raise ConfigError("spec_decode_speedup", "must be between 1 and 10")
        if self.gpu_utilization is not None and not 0.05 <= self.gpu_utilization <= 1.0:
            raise ConfigError("gpu_utilization", "must be between 0.05 and 1")
        if self.quantization not in QUANTIZATIONS:
            raise ConfigError("quantization", f"must be one of {', '.join(QUANTIZATIONS)}")
        if self.router not in ROUTERS:
            raise ConfigError("router", f"must be one of {', '.join(ROUTERS)}")

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
            # Only an absent value takes the default: 0 is a value, and validate() judges it.
            cache_hit_rate_delta=_given(number("cache_hit_rate_delta", 0.0), 0.0),
            spec_decode_speedup=_given(number("spec_decode_speedup", 1.0), 1.0),
            gpu_utilization=number("gpu_utilization", None),
            quantization=str(quantization),
            router=str(body.get("router") or "as_recorded").replace("-", "_"),
        )
        request.validate()
        return request


def _given(value: float | None, default: float) -> float:
    return default if value is None else value


def whatif_view(records: Sequence[RequestRecord], prices: PriceSheet,
                request: WhatIfRequest) -> dict[str, Any]:
    """``{baseline, projected, change, ...}`` from the roofline what-if engine; with the
    prefix-affine router, its replay (``routing``) and, unless a cache-hit change was
    given, the projection at its predicted hit-ratio gain."""
    routing = None
    delta = request.cache_hit_rate_delta
    if request.router == "prefix_affine":
        routing = prefix_affine_whatif(records)
        if not delta and routing.hit_ratio_gain is not None:
            delta = routing.hit_ratio_gain
    scenario = Scenario(
        cache_hit_rate_delta=delta,
        spec_decode_speedup=request.spec_decode_speedup,
        gpu_utilization=request.gpu_utilization,
        quantization=None if request.quantization == "none" else request.quantization,
    )
    try:
        scenario.validate()
        out = what_if(records, prices, scenario)
    except WhatIfError as exc:
        raise ConfigError("whatif", str(exc)) from exc
    out["engine"] = "roofline"
    out["modeled"] = True
    if routing is not None:
        out["routing"] = routing.to_json()
    return out
