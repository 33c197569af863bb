"""Prefix cache accounting: hit ratio, heavy-hitter prefixes, miss waste.

Fingerprints only: ``record.prefix_fingerprints[i]`` is a salted hash of the prompt prefix
through block ``i``, never content. A block is ``record.prefix_block_tokens`` tokens, as
the engine sent it (``tokenpath.prefix.block_tokens``), or ``block_tokens`` when it did not.

- Hit ratio is token-weighted: sum(cache_read_tokens) / sum(input_tokens).
- Miss waste: a prefix whose fingerprint was seen recently (before this request, within
  ``ttl_seconds``) but was recomputed. Its dollars are the request's prefill dollars times
  the recomputed tokens' share of the prefill FLOPs.
- Heavy hitters: a space-saving sketch (Metwally et al., 2005) of the longest previously
  seen prefix of each request: bounded memory, count over-estimated by at most ``error``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from tokenpath.leaks import WASTE_CAUSES, MissCause
from tokenpath.records import RequestRecord
from tokenpath.roofline import Roofline

# Tokens per fingerprinted block for records that do not carry their own: vLLM's default
# KV block size.
DEFAULT_BLOCK_TOKENS = 16
DEFAULT_RECENT_TTL_SECONDS = 600.0
DEFAULT_RECENT_CAPACITY = 65_536
DEFAULT_HEAVY_HITTER_CAPACITY = 256


@dataclass(slots=True)
class PrefixStats:
    fingerprint: str
    prefix_tokens: int
    count: int
    error: int
    hits: int
    misses: int
    waste_dollars: float
    recomputed_tokens: int = 0

    def to_json(self) -> dict[str, object]:
        return {"fingerprint": self.fingerprint, "prefix_tokens": self.prefix_tokens,
                "requests": self.count, "count_error": self.error, "hits": self.hits,
                "misses": self.misses, "recomputed_tokens": self.recomputed_tokens,
                "waste_dollars": self.waste_dollars}


class HeavyHitters:
    """Space-saving top-k: at most ``capacity`` fingerprints are held."""

    def __init__(self, capacity: int = DEFAULT_HEAVY_HITTER_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self._capacity = capacity
        self._entries: dict[str, PrefixStats] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def update(self, fingerprint: str, prefix_tokens: int, hit: bool, waste: float,
               recomputed_tokens: int = 0) -> None:
        entry = self._entries.get(fingerprint)
        if entry is None:
            floor = 0
            if len(self._entries) >= self._capacity:
                victim = min(self._entries.values(), key=lambda e: e.count)
                floor = victim.count
                del self._entries[victim.fingerprint]
            entry = PrefixStats(fingerprint, prefix_tokens, floor, floor, 0, 0, 0.0)
            self._entries[fingerprint] = entry
        entry.count += 1
        entry.prefix_tokens = max(entry.prefix_tokens, prefix_tokens)
        if hit:
            entry.hits += 1
        else:
            entry.misses += 1
        entry.waste_dollars += waste
        entry.recomputed_tokens += recomputed_tokens

    def top_by_waste(self, limit: int = 10) -> list[PrefixStats]:
        ranked = sorted(self._entries.values(), key=lambda e: (-e.waste_dollars, -e.count))
        return ranked[:limit]

    def top_by_count(self, limit: int = 10) -> list[PrefixStats]:
        return sorted(self._entries.values(), key=lambda e: -e.count)[:limit]


@dataclass(slots=True, init=False)  # a written __init__: see tokenpath/records.py
class _Seen:
    first: float
    last: float

    def __init__(self, first: float, last: float) -> None:
        self.first = first
        self.last = last


def _touch(table: OrderedDict[str, _Seen], fingerprint: str, at: float) -> bool:
    """Note ``fingerprint`` seen at ``at``: it moves to the end of ``table`` (the most
    recent), keeping both ends of when it was seen (records come in close order, not
    prefill order). True when it is new to the table."""
    seen = table.get(fingerprint)
    if seen is None:
        table[fingerprint] = _Seen(at, at)
        return True
    if at < seen.first:
        seen.first = at
    if at > seen.last:
        seen.last = at
    table.move_to_end(fingerprint)
    return False


def engine_key(record: RequestRecord) -> str:
    """The engine (GPU set) a record ran on: its node and engine id."""
    return f"{record.node or ''}/{record.engine_id or ''}"


class PrefixCacheTracker:
    """Remembers recent prefix fingerprints, everywhere and per engine; classifies and
    prices each recomputed fingerprinted block (tokenpath.leaks.MissCause):

    - a block never seen before (within ``ttl_seconds``, before this prefill) is ``cold``;
    - one seen on this same engine (node and engine id) is ``evicted``: the engine had
      computed it and no longer served it;
    - one seen only on other engines is ``routed_elsewhere``;
    - when all the seen-but-recomputed tokens fall within one block of what the cache
      served, they are ``sub_block``: block granularity and the engine's recompute of the
      last block, not an eviction.

    The partial block after the last full one is never classified (no fingerprint).
    Dollars are the record's prefill dollars times each cause's share of its prefill FLOPs
    (token share without a roofline). Waste is every cause but ``cold``."""

    def __init__(
        self,
        block_tokens: int = DEFAULT_BLOCK_TOKENS,
        ttl_seconds: float = DEFAULT_RECENT_TTL_SECONDS,
        capacity: int = DEFAULT_RECENT_CAPACITY,
        heavy_hitter_capacity: int | None = None,
    ) -> None:
        self._block_tokens = block_tokens
        self._ttl = ttl_seconds
        self._capacity = capacity
        self._recent: OrderedDict[str, _Seen] = OrderedDict()
        # fingerprint -> when first and last seen, per engine; at most ``capacity`` in all
        # (least recently seen first)
        self._by_engine: dict[str, OrderedDict[str, _Seen]] = {}
        self._engine_entries = 0
        # the top prefixes by waste: kept by the replay of stored records (what the API and
        # CLI show, for any window), not by the live attributor
        self.heavy_hitters = (None if heavy_hitter_capacity is None
                              else HeavyHitters(heavy_hitter_capacity))
        self.waste_dollars = 0.0
        self.recomputed_tokens = 0

    def top_by_waste(self, limit: int) -> list[PrefixStats]:
        if self.heavy_hitters is None:
            raise ValueError("this tracker keeps no heavy-hitter sketch")
        return self.heavy_hitters.top_by_waste(limit)

    def seen_prefix_tokens(self, record: RequestRecord, at: float) -> tuple[int, int]:
        """(tokens of the longest prefix seen before ``at``, its block index or -1)."""
        depth = -1
        for index, fingerprint in enumerate(record.prefix_fingerprints):
            seen = self._recent.get(fingerprint)
            if seen is None or not seen.first < at or at - seen.last > self._ttl:
                break
            depth = index
        block_tokens = record.prefix_block_tokens or self._block_tokens
        tokens = min(record.input_tokens, (depth + 1) * block_tokens)
        return tokens, depth

    def _seen_here_depth(self, record: RequestRecord, at: float) -> int:
        here = self._by_engine.get(engine_key(record))
        depth = -1
        if here is None:
            return depth
        for index, fingerprint in enumerate(record.prefix_fingerprints):
            seen = here.get(fingerprint)
            if seen is None or not seen.first < at or at - seen.last > self._ttl:
                break
            depth = index
        return depth

    def observe(self, record: RequestRecord, prefill_dollars: float,
                roofline: Roofline | None, known_waste: float | None = None) -> float:
        """Waste dollars of ``record`` (0 when nothing seen was recomputed); sets its
        ``miss_tokens`` and ``miss_dollars`` by cause and remembers its fingerprints.

        ``known_waste`` replays a stored record whose causes were priced when it was
        recorded: they are kept as they are.
        """
        if not record.prefix_fingerprints:
            return 0.0
        at = record.prefill_start_unix if record.prefill_start_unix is not None else (
            record.start_unix)
        seen_tokens, depth = self.seen_prefix_tokens(record, at)
        block = record.prefix_block_tokens or self._block_tokens
        here_tokens = min(seen_tokens, (self._seen_here_depth(record, at) + 1) * block)
        inputs = max(0, record.input_tokens)
        cached = min(inputs, max(0, record.cache_read_tokens))
        fingerprinted = min(inputs, len(record.prefix_fingerprints) * block)
        # token ranges of the computed, fingerprinted blocks, by cause
        ranges: dict[MissCause, tuple[int, int]] = {}
        seen_recomputed = max(0, seen_tokens - cached)
        if 0 < seen_recomputed <= block:
            ranges[MissCause.SUB_BLOCK] = (cached, seen_tokens)
        elif seen_recomputed:
            ranges[MissCause.EVICTED] = (cached, max(cached, here_tokens))
            ranges[MissCause.ROUTED_ELSEWHERE] = (max(cached, here_tokens), seen_tokens)
        ranges[MissCause.COLD] = (max(cached, seen_tokens), max(cached, seen_tokens,
                                                                 fingerprinted))
        new_tokens = max(1, inputs - cached)
        total_flops = roofline.prefill_flops(new_tokens, cached) if roofline else 0.0
        waste = 0.0
        wasted_tokens = min(new_tokens, seen_recomputed)
        if known_waste is None:
            record.miss_tokens, record.miss_dollars = {}, {}
        for cause, (low, high) in ranges.items():
            if high <= low:
                continue
            if known_waste is None:
                if prefill_dollars <= 0:
                    dollars = 0.0
                elif roofline is not None and total_flops > 0:
                    dollars = prefill_dollars * min(
                        1.0, roofline.prefill_flops(high - low, low) / total_flops)
                else:
                    dollars = prefill_dollars * min(1.0, (high - low) / new_tokens)
                record.miss_tokens[cause.value] = high - low
                record.miss_dollars[cause.value] = dollars
            if cause in WASTE_CAUSES and known_waste is None:
                waste += record.miss_dollars[cause.value]
        if known_waste is not None:
            waste = known_waste
        if depth >= 0:
            if self.heavy_hitters is not None:
                self.heavy_hitters.update(record.prefix_fingerprints[depth], seen_tokens,
                                          hit=cached >= seen_tokens, waste=waste,
                                          recomputed_tokens=wasted_tokens)
            self.recomputed_tokens += wasted_tokens
        self._remember(record, at)
        self.waste_dollars += waste
        return waste

    def _remember(self, record: RequestRecord, at: float) -> None:
        fingerprints = record.prefix_fingerprints
        recent = self._recent
        for fingerprint in fingerprints:
            _touch(recent, fingerprint, at)
        while len(recent) > self._capacity:
            recent.popitem(last=False)
        while recent:
            oldest = next(iter(recent.values()))
            if at - oldest.last <= self._ttl:
                break
            recent.popitem(last=False)
        key = engine_key(record)
        here = self._by_engine.setdefault(key, OrderedDict())
        for fingerprint in fingerprints:
            if _touch(here, fingerprint, at):
                self._engine_entries += 1
        self._trim_engine(key, at)

    def _trim_engine(self, key: str, at: float) -> None:
        """Per-engine memory: this engine's entries past the TTL go, and the engines'
        oldest entries go while they hold more than ``capacity`` in all."""
        here = self._by_engine[key]
        while here and at - next(iter(here.values())).last > self._ttl:
            here.popitem(last=False)
            self._engine_entries -= 1
        while self._engine_entries > self._capacity and self._by_engine:
            largest = max(self._by_engine, key=lambda k: len(self._by_engine[k]))
            self._by_engine[largest].popitem(last=False)
            self._engine_entries -= 1
            if not self._by_engine[largest]:
                del self._by_engine[largest]


def prefill_dollars(record: RequestRecord) -> float:
    """The record's apportioned prefill dollars (sum of its GPU stages' prefill phase)."""
    from tokenpath.stage_members import PREFILL

    return sum(t.phases[PREFILL].cost_dollars for t in record.stages.values()
               if PREFILL in t.phases)


def replay_prefixes(records: Iterable[RequestRecord],
                    block_tokens: int = DEFAULT_BLOCK_TOKENS) -> PrefixCacheTracker:
    """Replay stored records (in engine order) through a tracker. Each record's waste is
    the one priced when it was recorded (``cache_miss_waste_dollars``)."""
    tracker = PrefixCacheTracker(block_tokens=block_tokens,
                                 heavy_hitter_capacity=DEFAULT_HEAVY_HITTER_CAPACITY)
    for record in sorted(records, key=lambda r: r.prefill_start_unix or r.start_unix):
        tracker.observe(record, 0.0, None, known_waste=record.cache_miss_waste_dollars)
    return tracker


def top_prefixes_by_waste(records: Iterable[RequestRecord], limit: int = 10,
                          block_tokens: int = DEFAULT_BLOCK_TOKENS) -> list[PrefixStats]:
    """The repeated prefixes whose recomputation cost the most. Fingerprints only."""
    return replay_prefixes(records, block_tokens).top_by_waste(limit)
