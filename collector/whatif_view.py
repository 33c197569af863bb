"""/api/whatif: the UI's what-if page over the same engine as ``tokenpath whatif``.

``GET`` answers what the page opens with: the window's baseline and its default
scenarios, the routing what-if among them, read and calibrated once
(:func:`tokenpath.collector.cost.whatif_overview.whatif_overview`). ``POST`` is the form:
it parses and validates the fields (errors name the field), then runs
:func:`tokenpath.collector.cost.whatif_overview.run_whatif`, what ``tokenpath whatif``
runs. Both take the window as ``since`` counted back from ``until``. Every figure they
return is modeled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenpath.collector.cost.prices import PriceSheet
from tokenpath.collector.cost.whatif import Scenario, WhatIfError
from tokenpath.collector.cost.whatif_overview import WhatIfWindow, run_whatif, whatif_overview
from tokenpath.config import ConfigError, check, validate_fields
from tokenpath.records import RequestRecord

QUANTIZATIONS = ("none", "int8", "int4")
ROUTERS = ("as_recorded", "prefix_affine")


@dataclass(frozen=True, slots=True)
class WhatIfRequest:
    cache_hit_rate_delta: float = field(default=0.0, metadata=check(ge=-1.0, le=1.0))
    spec_decode_speedup: float = field(default=1.0, metadata=check(ge=1.0, le=10.0))
    gpu_utilization: float | None = field(default=None,
                                          metadata=check(ge=0.05, le=1.0, optional=True))
    quantization: str = field(default="none", metadata=check(one_of=QUANTIZATIONS))
    # prefix_affine: replay the fingerprints through a prefix-affine router
    # (collector/cost/routing_whatif.py) and project with its cache-hit gain
    router: str = field(default="as_recorded", metadata=check(one_of=ROUTERS))
    # whether the body gave the cache change: with the router, an absent one takes the
    # router's replayed hits instead (a given 0 keeps the recorded hit ratio)
    cache_change_given: bool = False

    def validate(self) -> None:
        validate_fields(self)  # the keys are the request body's: no section

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
        cache_change = number("cache_hit_rate_delta", None)
        request = cls(
            # Only an absent value takes the default: 0 is a value, and validate() judges it.
            cache_hit_rate_delta=_given(cache_change, 0.0),
            spec_decode_speedup=_given(number("spec_decode_speedup", 1.0), 1.0),
            gpu_utilization=number("gpu_utilization", None),
            quantization=str(quantization),
            router=str(body.get("router") or "as_recorded").replace("-", "_"),
            cache_change_given=cache_change is not None,
        )
        request.validate()
        return request


def _given(value: float | None, default: float) -> float:
    return default if value is None else value


def whatif_view(records: Sequence[RequestRecord], prices: PriceSheet,
                request: WhatIfRequest, window: WhatIfWindow | None = None) -> dict[str, Any]:
    """``{baseline, projected, change, change_pp, cache_hit_rate, ...}`` from the roofline
    what-if engine; with the prefix-affine router, its replay (``routing``) and, unless
    the body gave a cache-hit change, the projection at the replay's per-request hits."""
    scenario = Scenario(
        cache_hit_rate_delta=request.cache_hit_rate_delta,
        spec_decode_speedup=request.spec_decode_speedup,
        gpu_utilization=request.gpu_utilization,
        quantization=None if request.quantization == "none" else request.quantization,
    )
    try:
        out = run_whatif(records, prices, scenario,
                         request.router if request.router != "as_recorded" else None,
                         explicit_cache_change=request.cache_change_given)
    except WhatIfError as exc:
        raise ConfigError("whatif", str(exc)) from exc
    out["engine"] = "roofline"
    out["modeled"] = True
    if window is not None:
        out["window"] = {**window.to_json(), "records": len(records)}
    return out


def whatif_page_view(records: Sequence[RequestRecord], prices: PriceSheet,
                     window: WhatIfWindow) -> dict[str, Any]:
    """``GET /api/whatif``: the page's opening projections over ``records``, the window's."""
    return whatif_overview(records, prices, window)
