"""The SLO classes' summary from a list of records (views.slo_view's oracle)."""

from __future__ import annotations

from collections.abc import Iterable

from tokenpath.records import RequestRecord
from tokenpath.slo import SloConfig, SloSummary, summary_from_counts, unit_gpus_item


def summarize_records(records: Iterable[RequestRecord], window_seconds: float,
                      config: SloConfig | None = None) -> SloSummary | None:
    """:func:`summary_from_counts` from records (the reference the stores' views match)."""
    by_class: dict[str | None, dict[str, float]] = {}
    units: set[str] = set()
    for r in records:
        units.add(unit_gpus_item(r.node, r.engine_id, r.tensor_parallel))
        if r.slo is None or r.slo_outcome is None:
            continue
        values = by_class.setdefault(r.slo, {})
        for key, amount in ((f"slo_n:{r.slo_outcome}", 1.0),
                            (f"slo_c:{r.slo_outcome}", r.cost_dollars)):
            values[key] = values.get(key, 0.0) + amount
        if r.slo_miss_stage is not None:
            for key, amount in ((f"slo_ms:{r.slo_miss_stage}", 1.0),
                                (f"slo_mc:{r.slo_miss_stage}", r.cost_dollars)):
                values[key] = values.get(key, 0.0) + amount
    return summary_from_counts(by_class, window_seconds, units, config)
