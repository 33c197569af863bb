"""What a prefix-affine router would have saved, from the recorded fingerprints (modeled).

The recorded requests are replayed in prefill order through one prefix cache per engine
(an LRU of fingerprinted blocks, ``capacity_blocks`` each):

1. **Calibration.** Replayed with the engines that really served them, the caches give a
   hit for each request: the longest run of its fingerprints the engine holds. The
   capacity is the smallest that reproduces the recorded cache hits (bisection; hits grow
   with capacity), so eviction pressure, the blocks other tokens take and the engine's
   own rules are absorbed into one number fitted on the run itself.
2. **Counterfactual.** The same requests, each sent to the engine a prefix-affine router
   picks: rendezvous hashing of the request's first fingerprint over the engines seen
   (what llm-d's and Dynamo's prefix-aware routing approximate), with the calibrated
   capacity.

The gain in token-weighted hit ratio, the prefill tokens and dollars it saves (each
request's prefill dollars per computed token, times the tokens it no longer computes) and
the load skew it would cause (the busiest engine's share of requests over the mean share;
a real router caps it, which gives back part of the gain) are reported, all modeled, over
the newest ``MAX_REPLAY_RECORDS`` requests of the window.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from tokenpath.collector.cost.cache import engine_key, prefill_dollars
from tokenpath.records import RequestRecord

MAX_CAPACITY_BLOCKS = 1 << 24
# The newest requests replayed (each bisection step replays them all): about a second of
# CPU at 64 blocks per request.
MAX_REPLAY_RECORDS = 5_000


def rendezvous(key: str, engines: Sequence[str]) -> str:
    return max(engines, key=lambda e: hashlib.blake2b(f"{key}|{e}".encode(),
                                                      digest_size=8).digest())


@dataclass(frozen=True, slots=True)
class RoutingWhatIf:
    requests: int
    engines: int
    capacity_blocks: int
    recorded_hit_ratio: float | None
    replayed_hit_ratio: float | None  # calibration check: the model on the real routing
    predicted_hit_ratio: float | None
    prefill_tokens_saved: int
    prefill_dollars_saved: float
    load_skew_recorded: float | None
    load_skew_predicted: float | None
    # cached tokens the router adds (or takes away), per record id: what the roofline
    # what-if projects the router's cost and TTFT from (not in to_json)
    gains: Mapping[str, int] = field(default_factory=dict)

    @property
    def hit_ratio_gain(self) -> float | None:
        if self.predicted_hit_ratio is None or self.recorded_hit_ratio is None:
            return None
        return self.predicted_hit_ratio - self.recorded_hit_ratio

    def to_json(self) -> dict[str, object]:
        return {"router": "prefix_affine", "provenance": "modeled",
                "requests": self.requests, "engines": self.engines,
                "calibrated_capacity_blocks": self.capacity_blocks,
                "recorded_hit_ratio": self.recorded_hit_ratio,
                "replayed_hit_ratio": self.replayed_hit_ratio,
                "predicted_hit_ratio": self.predicted_hit_ratio,
                "hit_ratio_gain": self.hit_ratio_gain,
                "prefill_tokens_saved": self.prefill_tokens_saved,
                "prefill_dollars_saved": self.prefill_dollars_saved,
                "load_skew_recorded": self.load_skew_recorded,
                "load_skew_predicted": self.load_skew_predicted}


def _block(record: RequestRecord, default_block_tokens: int) -> int:
    return record.prefix_block_tokens or default_block_tokens


def replay_hits(records: Sequence[RequestRecord], assign: Callable[[RequestRecord], str],
                capacity_blocks: int, block_tokens: int) -> list[int]:
    """Cached tokens per record when each goes to ``assign(record)`` and every engine
    holds its ``capacity_blocks`` most recently used fingerprints."""
    caches: dict[str, OrderedDict[str, None]] = {}
    hits: list[int] = []
    for record in records:
        cache = caches.setdefault(assign(record), OrderedDict())
        depth = 0
        for fingerprint in record.prefix_fingerprints:
            if fingerprint not in cache:
                break
            depth += 1
        # an engine computes at least the prompt's last token
        hits.append(max(0, min(record.input_tokens - 1,
                               depth * _block(record, block_tokens))))
        for fingerprint in record.prefix_fingerprints:
            cache.pop(fingerprint, None)
            cache[fingerprint] = None
        while len(cache) > capacity_blocks:
            cache.popitem(last=False)
    return hits


def _skew(assignments: Sequence[str]) -> float | None:
    if not assignments:
        return None
    counts: dict[str, int] = {}
    for engine in assignments:
        counts[engine] = counts.get(engine, 0) + 1
    return max(counts.values()) / (len(assignments) / len(counts))


def prefix_affine_whatif(records: Sequence[RequestRecord],
                         block_tokens: int = 16) -> RoutingWhatIf:
    """The routing what-if over the records that carry fingerprints and an engine."""
    usable = sorted((r for r in records if r.prefix_fingerprints and r.input_tokens > 0),
                    key=lambda r: r.prefill_start_unix or r.start_unix)[-MAX_REPLAY_RECORDS:]
    engines = sorted({engine_key(r) for r in usable})
    inputs = sum(r.input_tokens for r in usable)
    recorded = sum(min(r.cache_read_tokens, r.input_tokens) for r in usable)
    if not usable or inputs == 0:
        return RoutingWhatIf(0, len(engines), 0, None, None, None, 0, 0.0, None, None)

    def replayed(capacity: int) -> int:
        return sum(replay_hits(usable, engine_key, capacity, block_tokens))

    low, high = 1, max(1, sum(len(r.prefix_fingerprints) for r in usable))
    high = min(high, MAX_CAPACITY_BLOCKS)
    if replayed(high) <= recorded:
        capacity = high
    else:  # the smallest capacity whose replay reaches the recorded hits
        while low < high:
            middle = (low + high) // 2
            if replayed(middle) >= recorded:
                high = middle
            else:
                low = middle + 1
        capacity = low
    calibrated = replayed(capacity)

    def affine(record: RequestRecord) -> str:
        return rendezvous(record.prefix_fingerprints[0], engines)

    predicted = replay_hits(usable, affine, capacity, block_tokens)
    baseline = replay_hits(usable, engine_key, capacity, block_tokens)
    saved_tokens = 0
    saved_dollars = 0.0
    gains: dict[str, int] = {}
    for record, now, then in zip(usable, baseline, predicted, strict=True):
        gain = then - now
        if gain:
            gains[record.record_id] = gain
        saved_tokens += gain
        computed = max(1, record.input_tokens - min(record.cache_read_tokens,
                                                    record.input_tokens))
        saved_dollars += prefill_dollars(record) * gain / computed
    return RoutingWhatIf(
        requests=len(usable), engines=len(engines), capacity_blocks=capacity,
        recorded_hit_ratio=recorded / inputs, replayed_hit_ratio=calibrated / inputs,
        predicted_hit_ratio=(recorded + saved_tokens) / inputs,
        prefill_tokens_saved=saved_tokens, prefill_dollars_saved=saved_dollars,
        load_skew_recorded=_skew([engine_key(r) for r in usable]),
        load_skew_predicted=_skew([affine(r) for r in usable]), gains=gains)
