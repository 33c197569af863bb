"""Per-engine indexes of the KV blocks engines hold, and stored blocks by measured cause.

Each engine's :class:`EngineIndex` holds the blocks it reported stored and not yet
removed, counted per (group, medium, hash): vLLM keeps duplicate physical blocks of one
hash, and each copy is stored and removed on its own, so the count reaches zero only when
the last copy goes. Removed hashes are remembered (with the time they went) up to the
same bound, so that a later store of one is known to be an eviction's cost.

A block stored on the engine's GPU medium (``GPU``, or none named) is:

- ``already_held`` when this engine holds that hash already (hits reported in vLLM's
  ``full`` mode, the last block of a fully cached prompt re-stored): not a miss;
- ``evicted`` when this engine removed the hash earlier (how long it had been gone is
  summed);
- ``routed`` when another engine of the same model on this node holds it;
- ``cold`` otherwise: the first time this node's engines see it, as far as the agent
  has watched them.

Stores on another medium (a CPU offload tier) are indexed, not counted: they copy blocks
computed elsewhere. Keys are the process's keyed hash (SipHash) of the engine's block
hash, 64 bits: hashes an engine sends cannot be chosen to collide in the dicts, and a
block costs one small integer instead of a 32-byte string.

All methods take the tracker's lock; the receiver thread applies batches, the poll
thread reads the counters (:meth:`KvTracker.add_to`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final

from tokenpath import metric_names as mn
from tokenpath.agent.kv_wire import MEDIUM_GPU, BlockHash, Cleared, KvBatch, Removed, Stored
from tokenpath.agent.snapshot import Points, add_point
from tokenpath.labels import BoundedLabel

CAUSE_EVICTED: Final = "evicted"
CAUSE_ROUTED: Final = "routed"
CAUSE_COLD: Final = "cold"
CAUSE_ALREADY_HELD: Final = "already_held"
MISS_CAUSES: Final = (CAUSE_EVICTED, CAUSE_ROUTED, CAUSE_COLD)
STORE_CAUSES: Final = (*MISS_CAUSES, CAUSE_ALREADY_HELD)
# Reasons of tokenpath_kv_events_dropped_total.
DROP_UNDECODABLE: Final = "undecodable"
DROP_MALFORMED: Final = "malformed"
DROP_GAP: Final = "gap"
DROP_INDEX_FULL: Final = "index_full"
DROP_REASONS: Final = (DROP_UNDECODABLE, DROP_MALFORMED, DROP_GAP, DROP_INDEX_FULL)
DEFAULT_MAX_BLOCKS: Final = 1_000_000
# Blocks applied per hold of the tracker's lock (about 5 ms of CPU here).
BLOCKS_PER_LOCK: Final = 4096
# (group, medium) pairs one engine may use: KV-cache groups (full and sliding-window
# attention, ...) times mediums (GPU, CPU, storage) are a handful in practice.
MAX_GROUPS_PER_ENGINE: Final = 64

GroupKey = tuple[int, str]


def block_key(block_hash: BlockHash) -> int:
    """A 64-bit keyed hash of an engine's block hash (bytes or integer)."""
    if isinstance(block_hash, int):
        block_hash = block_hash.to_bytes(8, "big", signed=block_hash < 0)
    return hash(block_hash)


@dataclass(slots=True)
class EngineCounts:
    """Cumulative counters of one engine (``engine`` and ``model`` are label values)."""

    stored_blocks: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(STORE_CAUSES, 0.0))
    recomputed_tokens: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(MISS_CAUSES, 0.0))
    removed_blocks: float = 0.0
    lifetime_seconds: float = 0.0
    evicted_gone_seconds: float = 0.0
    dropped: dict[str, float] = field(default_factory=dict)
    resets: float = 0.0
    batches: float = 0.0


class EngineIndex:
    """The blocks one engine holds and the ones it removed, bounded by ``max_blocks``."""

    __slots__ = ("_copies", "_removed", "_removed_size", "counts", "engine", "held",
                 "max_blocks", "model", "size")

    def __init__(self, engine: str, model: str, max_blocks: int) -> None:
        self.engine = engine
        self.model = model
        self.max_blocks = max_blocks
        # group key -> block key -> time stored; copies beyond the first (rare) apart
        self.held: dict[GroupKey, dict[int, float]] = {}
        self._copies: dict[tuple[GroupKey, int], int] = {}
        # group key -> block key -> time removed, oldest first
        self._removed: dict[GroupKey, dict[int, float]] = {}
        self._removed_size = 0
        self.size = 0  # distinct (group, medium, hash) held
        self.counts = EngineCounts()

    @property
    def remembered_removals(self) -> int:
        """Removed hashes remembered, over every group (at most ``max_blocks``)."""
        return sum(len(history) for history in self._removed.values())

    def holds(self, group: GroupKey, key: int) -> bool:
        blocks = self.held.get(group)
        return blocks is not None and key in blocks

    def reset(self) -> None:
        """Forget every block (the engine cleared its cache, or restarted)."""
        self.held.clear()
        self._copies.clear()
        self._removed.clear()
        self._removed_size = 0
        self.size = 0
        self.counts.resets += 1

    def drop(self, reason: str, count: float = 1.0) -> None:
        dropped = self.counts.dropped
        dropped[reason] = dropped.get(reason, 0.0) + count

    def _group(self, group: GroupKey, blocks: int) -> dict[int, float] | None:
        """The held blocks of ``group``; None (the blocks counted dropped) past
        ``MAX_GROUPS_PER_ENGINE`` groups."""
        held = self.held.get(group)
        if held is None:
            if len(self.held) >= MAX_GROUPS_PER_ENGINE:
                self.drop(DROP_INDEX_FULL, float(blocks))
                return None
            self.held[group] = held = {}
            self._removed[group] = {}
        return held

    def store(self, event: Stored, ts: float,
              others: Callable[[GroupKey, int], bool]) -> None:
        group = (event.group, event.medium)
        blocks = self._group(group, len(event.hashes))
        if blocks is None:
            return
        removed = self._removed.get(group)
        counted = event.medium == MEDIUM_GPU
        counts = self.counts
        for block_hash in event.hashes:
            key = block_key(block_hash)
            if key in blocks:
                copy = (group, key)
                self._copies[copy] = self._copies.get(copy, 0) + 1
                if counted:
                    counts.stored_blocks[CAUSE_ALREADY_HELD] += 1
                continue
            if self.size >= self.max_blocks:
                self.drop(DROP_INDEX_FULL)
                continue
            gone_at = removed.pop(key, None) if removed is not None else None
            if gone_at is not None:
                self._removed_size -= 1
            blocks[key] = ts
            self.size += 1
            if not counted:
                continue
            if gone_at is not None:
                cause = CAUSE_EVICTED
                counts.evicted_gone_seconds += max(0.0, ts - gone_at)
            elif others(group, key):
                cause = CAUSE_ROUTED
            else:
                cause = CAUSE_COLD
            counts.stored_blocks[cause] += 1
            counts.recomputed_tokens[cause] += event.block_size

    def remove(self, event: Removed, ts: float) -> None:
        group = (event.group, event.medium)
        blocks = self._group(group, len(event.hashes))
        if blocks is None:
            return
        removed = self._removed[group]
        counts = self.counts
        for block_hash in event.hashes:
            key = block_key(block_hash)
            stored_at = blocks.get(key)
            if stored_at is not None:
                copy = (group, key)
                copies = self._copies.get(copy)
                if copies is not None:  # another copy of the hash is still held
                    if copies > 1:
                        self._copies[copy] = copies - 1
                    else:
                        del self._copies[copy]
                    continue
                del blocks[key]
                self.size -= 1
                counts.lifetime_seconds += max(0.0, ts - stored_at)
            # A removal of a block stored before the agent watched still tells that the
            # engine had it: a later store of it is an eviction's cost.
            counts.removed_blocks += 1
            if removed.pop(key, None) is None:
                self._removed_size += 1
            removed[key] = ts
            if self._removed_size > self.max_blocks:  # forget this group's oldest removal
                del removed[next(iter(removed))]
                self._removed_size -= 1


class KvTracker:
    """Every engine's index on this node, and their counters for /metrics and the push."""

    def __init__(self, *, models: dict[str, str] | None = None,
                 max_blocks: int = DEFAULT_MAX_BLOCKS, max_engines: int = 64) -> None:
        self._models = dict(models or {})
        self._max_blocks = max_blocks
        self._engine_label = BoundedLabel(max_engines, mn.LABEL_ENGINE)
        self._engines: dict[str, EngineIndex] = {}
        self._lock = threading.Lock()

    def _engine(self, engine_id: str) -> EngineIndex:
        """The index of ``engine_id`` (its label bounded: past the cap, ``other``); the
        caller holds the lock."""
        label = self._engine_label(engine_id)
        index = self._engines.get(label)
        if index is None:
            model = self._models.get(engine_id, mn.UNKNOWN)
            self._engines[label] = index = EngineIndex(label, model, self._max_blocks)
        return index

    def apply(self, engine_id: str, batch: KvBatch) -> None:
        """Apply a batch's events in order. The lock is taken for at most
        ``BLOCKS_PER_LOCK`` blocks at a time, so a reader (a scrape, a push) never waits
        for a whole large batch."""
        with self._lock:
            index = self._engine(engine_id)
            index.counts.batches += 1
        for event in batch.events:
            if isinstance(event, Cleared):
                with self._lock:
                    index.reset()
                continue
            hashes = event.hashes
            for start in range(0, len(hashes), BLOCKS_PER_LOCK):
                piece = event if len(hashes) <= BLOCKS_PER_LOCK else dataclasses.replace(
                    event, hashes=hashes[start:start + BLOCKS_PER_LOCK])
                with self._lock:
                    if isinstance(piece, Stored):
                        index.store(piece, batch.ts, self._held_elsewhere(index))
                    else:
                        index.remove(piece, batch.ts)

    def _held_elsewhere(self, index: EngineIndex) -> Callable[[GroupKey, int], bool]:
        peers = [other for other in self._engines.values()
                 if other is not index and other.model == index.model]

        def held(group: GroupKey, key: int) -> bool:
            return any(peer.holds(group, key) for peer in peers)
        return held

    def reset(self, engine_id: str) -> None:
        with self._lock:
            self._engine(engine_id).reset()

    def drop(self, engine_id: str, reason: str, count: float = 1.0) -> None:
        with self._lock:
            self._engine(engine_id).drop(reason, count)

    def engines(self) -> Iterable[EngineIndex]:
        with self._lock:
            return list(self._engines.values())

    def resident_blocks(self) -> int:
        with self._lock:
            return sum(index.size for index in self._engines.values())

    def add_to(self, points: Points) -> None:
        """The counters of every engine seen, as series (cumulative)."""
        with self._lock:
            rows = [(index.engine, index.model, index.size, _copy(index.counts))
                    for index in self._engines.values()]
        for engine, model, size, counts in rows:
            labels = (engine, model)
            for cause, tokens in counts.recomputed_tokens.items():
                add_point(points, mn.KV_RECOMPUTED_TOKENS, (*labels, cause), tokens)
            for cause, blocks in counts.stored_blocks.items():
                add_point(points, mn.KV_STORED_BLOCKS, (*labels, cause), blocks)
            add_point(points, mn.KV_REMOVED_BLOCKS, labels, counts.removed_blocks)
            add_point(points, mn.KV_BLOCK_LIFETIME_SECONDS, labels, counts.lifetime_seconds)
            add_point(points, mn.KV_EVICTED_GONE_SECONDS, labels, counts.evicted_gone_seconds)
            add_point(points, mn.KV_RESIDENT_BLOCKS, labels, float(size))
            add_point(points, mn.KV_INDEX_RESETS, labels, counts.resets)
            add_point(points, mn.KV_EVENT_BATCHES, (engine,), counts.batches)
            for reason, dropped in counts.dropped.items():
                add_point(points, mn.KV_EVENTS_DROPPED, (engine, reason), dropped)


def _copy(counts: EngineCounts) -> EngineCounts:
    return EngineCounts(dict(counts.stored_blocks), dict(counts.recomputed_tokens),
                        counts.removed_blocks, counts.lifetime_seconds,
                        counts.evicted_gone_seconds, dict(counts.dropped), counts.resets,
                        counts.batches)
