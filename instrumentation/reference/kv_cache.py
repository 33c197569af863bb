"""A paged KV cache with block-hash prefix caching and LRU eviction (vLLM-style).

Memory is ``num_blocks`` blocks of ``block_tokens`` tokens. A full block of a prompt is
identified by a chained hash (parent block hash, the block's token ids), so a block is
reusable exactly when the whole prefix up to it matches. Blocks whose sequences have
finished keep their contents and stay findable by hash until they are evicted, least
recently used first, when a new block is needed.

With :meth:`PagedKVCache.record_events`, the cache also keeps what a vLLM engine publishes
as KV-cache events: each block hash it registers (stored) and each one it evicts
(removed), in order, until :meth:`PagedKVCache.drain_events` takes them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from tokenpath.config import ConfigError

DEFAULT_BLOCK_TOKENS = 16
DEFAULT_NUM_BLOCKS = 4096

BlockHash = int
KV_STORED = "stored"
KV_REMOVED = "removed"
KvCacheEvent = tuple[str, BlockHash]  # (KV_STORED or KV_REMOVED, block hash)


def block_hashes(token_ids: Sequence[int], block_tokens: int) -> list[BlockHash]:
    """Chained hashes of every full block of ``token_ids``."""
    out: list[BlockHash] = []
    parent: BlockHash = 0
    for start in range(0, len(token_ids) - block_tokens + 1, block_tokens):
        parent = hash((parent, tuple(token_ids[start : start + block_tokens])))
        out.append(parent)
    return out


@dataclass(frozen=True, slots=True)
class Allocation:
    """What :meth:`PagedKVCache.allocate` did for a sequence."""

    cached_tokens: int  # prompt tokens whose KV was found in the cache
    blocks: int  # blocks the sequence holds now


@dataclass(slots=True)
class KVCacheStats:
    query_tokens: int = 0
    hit_tokens: int = 0
    evictions: int = 0

    @property
    def hit_ratio(self) -> float:
        """Token-weighted prefix-cache hit ratio."""
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0


class PagedKVCache:
    """Block allocator with prefix caching. Not thread-safe: one engine loop owns it."""

    def __init__(self, num_blocks: int = DEFAULT_NUM_BLOCKS,
                 block_tokens: int = DEFAULT_BLOCK_TOKENS) -> None:
        if num_blocks < 1:
            raise ConfigError("kv_blocks", "must be at least 1")
        if block_tokens < 1:
            raise ConfigError("kv_block_tokens", "must be at least 1")
        self.num_blocks = num_blocks
        self.block_tokens = block_tokens
        self.stats = KVCacheStats()
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # never-hashed blocks
        self._evictable: OrderedDict[BlockHash, int] = OrderedDict()  # LRU, oldest first
        self._by_hash: dict[BlockHash, int] = {}
        self._hash_of: dict[int, BlockHash] = {}
        self._refs = [0] * num_blocks
        self._seq_blocks: dict[str, list[int]] = {}
        self._seq_tokens: dict[str, int] = {}
        self._events: list[KvCacheEvent] | None = None

    def record_events(self) -> None:
        """Keep stored and removed block hashes from now on (see :meth:`drain_events`)."""
        if self._events is None:
            self._events = []

    def drain_events(self) -> list[KvCacheEvent]:
        """The events kept since the last call, oldest first."""
        events = self._events
        if not events:
            return []
        self._events = []
        return events

    # --- queries -----------------------------------------------------------------------
    def cached_prefix_tokens(self, token_ids: Sequence[int]) -> int:
        """How many leading tokens of ``token_ids`` have their KV in the cache."""
        hits = 0
        for block_hash in block_hashes(token_ids, self.block_tokens):
            if block_hash not in self._by_hash:
                break
            hits += 1
        return hits * self.block_tokens

    @property
    def free_blocks(self) -> int:
        """Blocks available for new data (never used, or cached but unreferenced)."""
        return len(self._free) + len(self._evictable)

    @property
    def usage_ratio(self) -> float:
        return 1.0 - self.free_blocks / self.num_blocks

    def blocks_of(self, seq_id: str) -> list[int]:
        return list(self._seq_blocks.get(seq_id, ()))

    def is_cached(self, block_hash: BlockHash) -> bool:
        return block_hash in self._by_hash

    # --- allocation --------------------------------------------------------------------
    def allocate(self, seq_id: str, token_ids: Sequence[int]) -> Allocation | None:
        """Reserve blocks for a prompt, reusing cached prefix blocks.

        Returns None (and changes nothing) when the cache cannot hold the prompt. At least
        one prompt token is always computed, as in vLLM, so a fully cached prompt reports
        ``len - 1`` cached tokens at most.
        """
        if seq_id in self._seq_blocks:
            raise ValueError(f"sequence {seq_id!r} already holds blocks")
        hashes = block_hashes(token_ids, self.block_tokens)
        hit_blocks: list[int] = []
        for block_hash in hashes:
            block = self._by_hash.get(block_hash)
            if block is None:
                break
            hit_blocks.append(block)
        total_blocks = max(1, -(-len(token_ids) // self.block_tokens))
        new_needed = total_blocks - len(hit_blocks)
        reusable_evictable = sum(1 for b in hit_blocks if self._refs[b] == 0)
        if new_needed > self.free_blocks - reusable_evictable:
            return None
        for block in hit_blocks:
            if self._refs[block] == 0:
                self._evictable.pop(self._hash_of[block], None)
            self._refs[block] += 1
        blocks = list(hit_blocks)
        for index in range(len(hit_blocks), total_blocks):
            block = self._take_block()
            self._refs[block] = 1
            if index < len(hashes):
                self._register(block, hashes[index])
            blocks.append(block)
        self._seq_blocks[seq_id] = blocks
        self._seq_tokens[seq_id] = len(token_ids)
        cached = min(len(hit_blocks) * self.block_tokens, max(0, len(token_ids) - 1))
        self.stats.query_tokens += len(token_ids)
        self.stats.hit_tokens += cached
        return Allocation(cached_tokens=cached, blocks=len(blocks))

    def can_append(self, seq_id: str) -> bool:
        """Whether one more token fits without a block that is not available."""
        tokens = self._seq_tokens[seq_id]
        return tokens % self.block_tokens != 0 or self.free_blocks > 0

    def append_token(self, seq_id: str) -> bool:
        """Grow a sequence by one generated token; False when no block is free."""
        tokens = self._seq_tokens[seq_id]
        if tokens % self.block_tokens == 0 and tokens > 0:
            if self.free_blocks == 0:
                return False
            block = self._take_block()
            self._refs[block] = 1
            self._seq_blocks[seq_id].append(block)
        self._seq_tokens[seq_id] = tokens + 1
        return True

    def free(self, seq_id: str) -> None:
        """Release a sequence's blocks; hashed blocks stay cached (most recent last)."""
        blocks = self._seq_blocks.pop(seq_id, None)
        self._seq_tokens.pop(seq_id, None)
        if blocks is None:
            return
        for block in reversed(blocks):  # evict a prefix's tail before its head
            self._refs[block] -= 1
            if self._refs[block] > 0:
                continue
            block_hash = self._hash_of.get(block)
            if block_hash is None:
                self._free.append(block)
            else:
                self._evictable[block_hash] = block
                self._evictable.move_to_end(block_hash)

    # --- internals ---------------------------------------------------------------------
    def _take_block(self) -> int:
        if self._free:
            return self._free.pop()
        block_hash, block = self._evictable.popitem(last=False)
        del self._by_hash[block_hash]
        del self._hash_of[block]
        self.stats.evictions += 1
        if self._events is not None:
            self._events.append((KV_REMOVED, block_hash))
        return block

    def _register(self, block: int, block_hash: BlockHash) -> None:
        if block_hash in self._by_hash:  # a deeper block outlived an evicted ancestor
            return
        self._by_hash[block_hash] = block
        self._hash_of[block] = block_hash
        if self._events is not None:
            self._events.append((KV_STORED, block_hash))
