"""The time series from a list of records (views.timeseries_view's oracle,
``/api/timeseries``): per bucket of end time, exact sums and percentiles."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from testkit.oracles.report import percentile
from tokenpath.collector.api_views import DEFAULT_TIMESERIES_BUCKETS, MAX_TIMESERIES_BUCKETS
from tokenpath.records import RequestRecord
from tokenpath.report import token_weighted_hit_ratio


def timeseries_view(records: Sequence[RequestRecord],
                    buckets: int = DEFAULT_TIMESERIES_BUCKETS) -> dict[str, Any]:
    """Per time bucket (by request end time): requests, token-weighted hit ratio, TTFT p50,
    output tokens/s and dollars. Empty buckets keep their place with null ratios."""
    if not records:
        return {"bucket_seconds": 0.0, "start_unix": None, "points": []}
    buckets = max(1, min(buckets, MAX_TIMESERIES_BUCKETS))
    start = min(r.end_unix for r in records)
    end = max(r.end_unix for r in records)
    width = max((end - start) / buckets, 1e-9) if end > start else 1.0
    if end <= start:
        buckets = 1
    groups: list[list[RequestRecord]] = [[] for _ in range(buckets)]
    for record in records:
        index = min(buckets - 1, int((record.end_unix - start) / width))
        groups[index].append(record)
    points = []
    for index, group in enumerate(groups):
        ttfts = [r.ttft_seconds for r in group if r.ttft_seconds is not None]
        output = sum(r.output_tokens for r in group)
        points.append({
            "start_unix": start + index * width,
            "requests": len(group),
            "prefix_cache_hit_ratio": token_weighted_hit_ratio(group),
            "ttft_p50_seconds": percentile(ttfts, 0.5),
            "output_tokens_per_second": output / width if width > 0 else 0.0,
            "cost_dollars": sum(r.cost_dollars for r in group),
            "cache_miss_waste_dollars": sum(r.cache_miss_waste_dollars for r in group),
        })
    return {"bucket_seconds": width, "start_unix": start, "points": points}
