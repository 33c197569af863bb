"""The money leaks from a list of records: the ranked leaks (views.rank_leaks_view's oracle)
and the leaks page (views.leaks_view's, ``/api/leaks``): cache misses with the
repeated-prefix table replayed over every record, long contexts by context bucket, small
packets and the last mile, every figure summed record by record."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from testkit.oracles.last_mile import summarize_last_mile
from testkit.oracles.report import miss_causes
from tokenpath.collector.api_views import DEFAULT_LEAK_LIMIT, DEFAULT_LONG_CONTEXT_TOKENS
from tokenpath.collector.cost.cache import DEFAULT_BLOCK_TOKENS, prefill_dollars, replay_prefixes
from tokenpath.collector.cost.catalog import catalog_model_name
from tokenpath.collector.cost.leak_ranking import COALESCE_FIX_TOKENS, RankedLeak
from tokenpath.collector.cost.longcontext import ROOFLINE_GPU, spend_by_context_bucket
from tokenpath.collector.cost.routing_whatif import prefix_affine_whatif
from tokenpath.last_mile import (
    DEFAULT_PACKETS_PER_TOKEN_THRESHOLD,
    coalesced_packets,
    is_stream,
    packets_of,
)
from tokenpath.leaks import (
    LONG_CONTEXT_TOKENS,
    WASTE_CAUSES,
    MissCause,
    context_bucket_edges,
    context_bucket_labels,
    context_tokens,
)
from tokenpath.records import RequestRecord
from tokenpath.report import token_weighted_hit_ratio
from tokenpath.roofline import GPUS, MODELS, Roofline
from tokenpath.stages import RESPONSE_PATH_STAGES, StageId
from tokenpath.wire_sizes import PACKET_OVERHEAD_BYTES


def last_doubling_prefill_dollars(records: Iterable[RequestRecord],
                                  threshold_tokens: int = LONG_CONTEXT_TOKENS) -> float:
    """What the last doubling of context cost in prefill, over the long-context requests:
    each one's prefill dollars times the share of its prefill FLOPs that halving its prompt
    (new and cached tokens alike) would remove (modeled; attention makes it more than
    half). Requests of a model the catalog does not know count at a half."""
    total = 0.0
    for record in records:
        if context_tokens(record) < threshold_tokens:
            continue
        dollars = prefill_dollars(record)
        if dollars <= 0:
            continue
        model = catalog_model_name(record.model)
        cached = max(0, min(record.cache_read_tokens, record.input_tokens - 1))
        new = max(1, record.input_tokens - cached)
        if model is None:
            total += dollars / 2
            continue
        roofline = Roofline(GPUS[ROOFLINE_GPU], MODELS[model])
        full = roofline.prefill_flops(new, cached)
        half = roofline.prefill_flops(max(1, new // 2), cached // 2)
        total += dollars * (1.0 - half / full) if full > 0 else 0.0
    return total


def _cache_leak(records: Sequence[RequestRecord], replay_routing: bool) -> RankedLeak:
    causes = miss_causes(records)
    waste = {c: causes[c.value] for c in WASTE_CAUSES}
    top = max(waste.values(), key=lambda m: m.dollars)
    dollars = sum(m.dollars for m in waste.values())
    if top.cause is MissCause.ROUTED_ELSEWHERE and top.dollars > 0 and replay_routing:
        routed = prefix_affine_whatif(records)
        gain = routed.hit_ratio_gain or 0.0
        return RankedLeak("cache_misses", dollars, top.fix, max(0.0, routed.prefill_dollars_saved),
                          f"a prefix-affine router: hit ratio {gain * 100:+.1f} pp (replayed)")
    return RankedLeak("cache_misses", dollars, top.fix, top.dollars,
                      f"the {top.cause.value} misses' prefill (an upper bound)")


def _long_context_leak(records: Sequence[RequestRecord]) -> RankedLeak:
    long = [r for r in records if context_tokens(r) >= LONG_CONTEXT_TOKENS]
    return RankedLeak(
        "long_contexts", sum(r.cost_dollars for r in long),
        f"cap, summarise or retrieve contexts past {LONG_CONTEXT_TOKENS:,} tokens; cache the "
        "shared part", last_doubling_prefill_dollars(long),
        f"halving the {len(long)} long contexts (their last doubling's prefill)")


def _last_mile_leak(records: Sequence[RequestRecord], dollars_per_byte: float) -> RankedLeak:
    streams = [r for r in records if is_stream(r)]
    response = sum(r.stages[StageId.RESPONSE_PATH].cost_dollars for r in streams
                   if StageId.RESPONSE_PATH in r.stages)
    framing = sum(packets_of(r) for r in streams) * PACKET_OVERHEAD_BYTES * dollars_per_byte
    coalesced = sum(coalesced_packets(r, COALESCE_FIX_TOKENS) for r in streams) * (
        PACKET_OVERHEAD_BYTES * dollars_per_byte)
    return RankedLeak(
        "last_mile", response + framing,
        f"write {COALESCE_FIX_TOKENS} tokens per streamed chunk (or flush on a timer)",
        max(0.0, framing - coalesced),
        f"the framing of {COALESCE_FIX_TOKENS}-token writes instead of one per token")


def rank_leaks(records: Sequence[RequestRecord], network_dollars_per_byte: float,
               replay_routing: bool = True) -> list[RankedLeak]:
    """``replay_routing``: price the routing fix by the routing what-if's replay (the CLI
    and the demo; seconds on a large window), else by the routed misses' dollars (an upper
    bound: the API, which answers every UI refresh)."""
    leaks = [_cache_leak(records, replay_routing), _long_context_leak(records),
             _last_mile_leak(records, network_dollars_per_byte)]
    return sorted(leaks, key=lambda leak: -leak.dollars)


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
