"""Read-only views the built-in UI needs, computed from request records.

Plain functions over ``RequestRecord`` sequences, returning JSON-ready dicts; the HTTP
routes only fetch records and call these. Until the cost model's heavy-hitter sketch is
wired in, the prefix leak table is computed here from the records' prefix fingerprints
(``source: "records"``); the response shape stays the same when it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenpath.collector.cost.cache import DEFAULT_BLOCK_TOKENS, prefill_dollars, replay_prefixes
from tokenpath.collector.cost.leak_ranking import rank_leaks
from tokenpath.collector.cost.longcontext import (
    last_doubling_prefill_dollars,
    spend_by_context_bucket,
)
from tokenpath.last_mile import (
    DEFAULT_PACKETS_PER_TOKEN_THRESHOLD,
    summarize_last_mile,
)
from tokenpath.leaks import (
    LONG_CONTEXT_TOKENS,
    context_bucket_edges,
    context_bucket_labels,
    context_tokens,
)
from tokenpath.records import RequestRecord
from tokenpath.report import (
    miss_causes,
    percentile,
    token_weighted_hit_ratio,
)
from tokenpath.stages import GPU_STAGES, NETWORK_STAGES, STAGES, StageId

# GET /api/requests: records per answer by default and at most; a client reads more in
# pages, each asking for records that ended at or before the last one it got (``until``).
DEFAULT_API_LIMIT = 100
MAX_API_LIMIT = 10_000
DEFAULT_TIMESERIES_BUCKETS = 30
MAX_TIMESERIES_BUCKETS = 500
DEFAULT_LEAK_LIMIT = 10
DEFAULT_LONG_CONTEXT_TOKENS = LONG_CONTEXT_TOKENS
# The response path: stages after the engine that carry bytes back to the client.
RESPONSE_PATH_STAGES: tuple[StageId, ...] = (*NETWORK_STAGES, StageId.RESPONSE_PATH)


def stages_view() -> list[dict[str, Any]]:
    """The 15-stage table in path order, as the UI draws it (never hard-coded in JS)."""
    return [
        {
            "id": stage.id.value,
            "order": stage.order,
            "title": stage.title,
            "emitted_by": stage.emitted_by,
            "bound_by": stage.bound_by,
            "group": stage.group.value,
            "gpu": stage.id in GPU_STAGES,
        }
        for stage in STAGES
    ]


# --- time series ----------------------------------------------------------------------------


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


# --- leaks ----------------------------------------------------------------------------------


def repeated_prefixes(records: Sequence[RequestRecord], block_tokens: int = DEFAULT_BLOCK_TOKENS,
                      limit: int = DEFAULT_LEAK_LIMIT) -> tuple[list[dict[str, Any]], int]:
    """The top ``limit`` repeated prefixes by waste, and the prefix tokens recomputed over
    all of them: the cost model's prefix tracker replayed over the stored records.
    Fingerprints and lengths only; prompt content never reaches the collector."""
    tracker = replay_prefixes(records, block_tokens)
    top = tracker.top_by_waste(limit)
    return [p.to_json() for p in top], tracker.recomputed_tokens


def long_context_view(records: Sequence[RequestRecord],
                      threshold_tokens: int = DEFAULT_LONG_CONTEXT_TOKENS) -> dict[str, Any]:
    """How much of the traffic (and its cost and prefill time) is long-context, by the
    context buckets every view shares (tokenpath.leaks), with the quadratic attention's
    share of each bucket's prefill and what the long requests' last doubling cost."""
    spend = spend_by_context_bucket(records)
    histogram = []
    for (low, high), label, bucket in zip(context_bucket_edges(), context_bucket_labels(),
                                          spend, strict=True):
        group = [r for r in records
                 if context_tokens(r) >= low and (high is None or context_tokens(r) < high)]
        histogram.append({
            "label": label,
            "min_tokens": low,
            "max_tokens": high,
            "requests": len(group),
            "cost_dollars": sum(r.cost_dollars for r in group),
            "prefill_seconds": sum(r.prefill_seconds or 0.0 for r in group),
            "attention_share_of_prefill_flops": bucket.attention_share,
        })
    long = [r for r in records if context_tokens(r) >= threshold_tokens]
    total_cost = sum(r.cost_dollars for r in records)
    total_prefill = sum(r.prefill_seconds or 0.0 for r in records)
    total_prefill_cost = sum(prefill_dollars(r) for r in records)
    return {
        "threshold_tokens": threshold_tokens,
        "requests": len(long),
        "share_of_requests": len(long) / len(records) if records else None,
        "share_of_cost": (sum(r.cost_dollars for r in long) / total_cost
                          if total_cost > 0 else None),
        "share_of_prefill_seconds": (sum(r.prefill_seconds or 0.0 for r in long) / total_prefill
                                     if total_prefill > 0 else None),
        "share_of_prefill_cost": (sum(prefill_dollars(r) for r in long) / total_prefill_cost
                                  if total_prefill_cost > 0 else None),
        "histogram": histogram,
        "last_doubling_prefill_dollars": last_doubling_prefill_dollars(records,
                                                                       threshold_tokens),
    }


def small_packet_view(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """Last-mile serialization: tiny chunks, and the response path's share of latency."""
    chunks = sum(r.response_chunks for r in records)
    small = sum(r.small_chunks for r in records)
    response_bytes = sum(r.response_bytes for r in records)
    path_seconds = sum(r.stages[s].seconds for r in records for s in RESPONSE_PATH_STAGES
                       if s in r.stages)
    all_seconds = sum(t.seconds for r in records for t in r.stages.values())
    return {
        "response_chunks": chunks,
        "small_chunks": small,
        "share": small / chunks if chunks else None,
        "mean_chunk_bytes": response_bytes / chunks if chunks else None,
        "response_path_share_of_latency": path_seconds / all_seconds if all_seconds else None,
        "response_path_cost_dollars": sum(r.stages[s].cost_dollars for r in records
                                          for s in RESPONSE_PATH_STAGES if s in r.stages),
    }


def prefill_dollars_per_computed_token(records: Sequence[RequestRecord]) -> float | None:
    """Prefill dollars per prompt token computed (not read from the cache) over the
    records; None when none is priced or none computed a token."""
    if not any(r.cost_dollars > 0 or r.naive_cost_dollars > 0 for r in records):
        return None
    computed = sum(r.input_tokens for r in records) - sum(r.cache_read_tokens for r in records)
    return sum(prefill_dollars(r) for r in records) / computed if computed > 0 else None


def leaks_view(records: Sequence[RequestRecord], limit: int = DEFAULT_LEAK_LIMIT,
               long_context_tokens: int = DEFAULT_LONG_CONTEXT_TOKENS,
               block_tokens: int = DEFAULT_BLOCK_TOKENS,
               packets_per_token_threshold: float = DEFAULT_PACKETS_PER_TOKEN_THRESHOLD,
               network_dollars_per_byte: float = 0.0) -> dict[str, Any]:
    """The three money leaks of README.md: cache misses, long contexts, small packets."""
    top, recomputed = repeated_prefixes(records, block_tokens, limit)
    return {
        "requests": len(records),
        "priced": any(r.cost_dollars > 0 or r.naive_cost_dollars > 0 for r in records),
        "cache": {
            "source": "records",
            "block_tokens": block_tokens,
            # The block sizes the records' fingerprints were taken with (each record's
            # own, or block_tokens for one that did not say).
            "block_tokens_used": sorted({r.prefix_block_tokens or block_tokens
                                         for r in records if r.prefix_fingerprints}),
            "prefix_cache_hit_ratio": token_weighted_hit_ratio(records),
            "cache_miss_waste_dollars": sum(r.cache_miss_waste_dollars for r in records),
            "prefill_dollars_per_computed_token": prefill_dollars_per_computed_token(records),
            "requests_with_fingerprints": sum(1 for r in records if r.prefix_fingerprints),
            "recomputed_prefix_tokens": recomputed,
            "by_cause": {cause: summary.to_json()
                         for cause, summary in miss_causes(records).items()},
            "top_prefixes": top,
        },
        "long_context": long_context_view(records, long_context_tokens),
        "small_packets": small_packet_view(records),
        "last_mile": summarize_last_mile(records, packets_per_token_threshold).to_json(),
        "ranked": ([leak.to_json() for leak in rank_leaks(records, network_dollars_per_byte,
                                                          replay_routing=False)]
                   if records else []),
    }


