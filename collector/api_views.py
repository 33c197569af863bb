"""Read-only views the built-in UI needs, computed from request records.

Plain functions over ``RequestRecord`` sequences, returning JSON-ready dicts; the HTTP
routes only fetch records and call these. Until the cost model's heavy-hitter sketch is
wired in, the prefix leak table is computed here from the records' prefix fingerprints
(``source: "records"``); the response shape stays the same when it is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenpath.records import RequestRecord
from tokenpath.report import percentile, token_weighted_hit_ratio
from tokenpath.stages import GPU_STAGES, NETWORK_STAGES, STAGES, Phase, StageId

DEFAULT_TIMESERIES_BUCKETS = 30
MAX_TIMESERIES_BUCKETS = 500
DEFAULT_LEAK_LIMIT = 10
DEFAULT_BLOCK_TOKENS = 16  # tokens per prefix-fingerprint block (vLLM's KV block size)
DEFAULT_LONG_CONTEXT_TOKENS = 8192
CONTEXT_BUCKET_EDGES = (1024, 2048, 4096, 8192, 16384, 32768)
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


@dataclass(slots=True)
class _PrefixTally:
    fingerprint: str
    prefix_tokens: int
    requests: int = 0
    hits: int = 0
    misses: int = 0
    recomputed_tokens: int = 0
    waste_dollars: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "prefix_tokens": self.prefix_tokens,
            "requests": self.requests,
            "hits": self.hits,
            "misses": self.misses,
            "recomputed_tokens": self.recomputed_tokens,
            "waste_dollars": self.waste_dollars,
        }


def repeated_prefixes(records: Sequence[RequestRecord], block_tokens: int = DEFAULT_BLOCK_TOKENS,
                      limit: int = DEFAULT_LEAK_LIMIT) -> tuple[list[dict[str, Any]], int]:
    """Prefixes seen again by later requests, ranked by waste dollars, then recomputed tokens.

    For each request (oldest first) the deepest fingerprint already seen in an earlier
    request is its repeated prefix. A request whose cached tokens cover less than that
    prefix recomputed the difference: a miss, and its miss-waste dollars land there.
    Fingerprints and lengths only; prompt content never reaches the collector.
    Returns the top ``limit`` prefixes and the recomputed tokens over all of them.
    """
    seen: set[str] = set()
    tallies: dict[str, _PrefixTally] = {}
    for record in sorted(records, key=lambda r: r.start_unix):
        depth = -1
        for index, fingerprint in enumerate(record.prefix_fingerprints):
            if fingerprint not in seen:
                break
            depth = index
        if depth >= 0:
            fingerprint = record.prefix_fingerprints[depth]
            prefix_tokens = (depth + 1) * block_tokens
            if record.input_tokens > 0:
                prefix_tokens = min(prefix_tokens, record.input_tokens)
            tally = tallies.get(fingerprint)
            if tally is None:
                tally = tallies[fingerprint] = _PrefixTally(fingerprint, prefix_tokens)
            tally.requests += 1
            recomputed = max(0, prefix_tokens - record.cache_read_tokens)
            if recomputed > 0:
                tally.misses += 1
                tally.recomputed_tokens += recomputed
            else:
                tally.hits += 1
            tally.waste_dollars += record.cache_miss_waste_dollars
        seen.update(record.prefix_fingerprints)
    ranked = sorted(tallies.values(),
                    key=lambda t: (-t.waste_dollars, -t.recomputed_tokens, -t.requests))
    return [t.to_json() for t in ranked[:limit]], sum(t.recomputed_tokens for t in ranked)


def _prefill_cost(record: RequestRecord) -> float:
    total = 0.0
    for stage in GPU_STAGES:
        timing = record.stages.get(stage)
        if timing is not None and Phase.PREFILL in timing.phases:
            total += timing.phases[Phase.PREFILL].cost_dollars
    return total


def _context_bucket_label(low: int, high: int | None) -> str:
    def k(tokens: int) -> str:
        return f"{tokens // 1024}k"

    if low == 0:
        return f"< {k(high or 0)}"
    return f"{k(low)}+" if high is None else f"{k(low)}-{k(high)}"


def long_context_view(records: Sequence[RequestRecord],
                      threshold_tokens: int = DEFAULT_LONG_CONTEXT_TOKENS) -> dict[str, Any]:
    """How much of the traffic (and its cost and prefill time) is long-context."""
    edges = (0, *CONTEXT_BUCKET_EDGES)
    histogram = []
    for i, low in enumerate(edges):
        high = edges[i + 1] if i + 1 < len(edges) else None
        group = [r for r in records
                 if r.input_tokens >= low and (high is None or r.input_tokens < high)]
        histogram.append({
            "label": _context_bucket_label(low, high),
            "min_tokens": low,
            "max_tokens": high,
            "requests": len(group),
            "cost_dollars": sum(r.cost_dollars for r in group),
            "prefill_seconds": sum(r.prefill_seconds or 0.0 for r in group),
        })
    long = [r for r in records if r.input_tokens >= threshold_tokens]
    total_cost = sum(r.cost_dollars for r in records)
    total_prefill = sum(r.prefill_seconds or 0.0 for r in records)
    total_prefill_cost = sum(_prefill_cost(r) for r in records)
    return {
        "threshold_tokens": threshold_tokens,
        "requests": len(long),
        "share_of_requests": len(long) / len(records) if records else None,
        "share_of_cost": (sum(r.cost_dollars for r in long) / total_cost
                          if total_cost > 0 else None),
        "share_of_prefill_seconds": (sum(r.prefill_seconds or 0.0 for r in long) / total_prefill
                                     if total_prefill > 0 else None),
        "share_of_prefill_cost": (sum(_prefill_cost(r) for r in long) / total_prefill_cost
                                  if total_prefill_cost > 0 else None),
        "histogram": histogram,
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


def leaks_view(records: Sequence[RequestRecord], limit: int = DEFAULT_LEAK_LIMIT,
               long_context_tokens: int = DEFAULT_LONG_CONTEXT_TOKENS,
               block_tokens: int = DEFAULT_BLOCK_TOKENS) -> dict[str, Any]:
    """The three money leaks of SPEC section 1: cache misses, long contexts, small packets."""
    top, recomputed = repeated_prefixes(records, block_tokens, limit)
    return {
        "requests": len(records),
        "priced": any(r.cost_dollars > 0 or r.naive_cost_dollars > 0 for r in records),
        "cache": {
            "source": "records",
            "block_tokens": block_tokens,
            "prefix_cache_hit_ratio": token_weighted_hit_ratio(records),
            "cache_miss_waste_dollars": sum(r.cache_miss_waste_dollars for r in records),
            "requests_with_fingerprints": sum(1 for r in records if r.prefix_fingerprints),
            "recomputed_prefix_tokens": recomputed,
            "top_prefixes": top,
        },
        "long_context": long_context_view(records, long_context_tokens),
        "small_packets": small_packet_view(records),
    }


def finite_or_none(value: float | None) -> float | None:
    """JSON has no NaN or infinity; the UI shows None as a dash."""
    if value is None or not math.isfinite(value):
        return None
    return value
