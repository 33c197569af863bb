from __future__ import annotations

import pytest

from tokenpath.config import ConfigError
from tokenpath.instrumentation.reference.kv_cache import PagedKVCache, block_hashes


def test_block_hashes_chain_over_full_blocks_only() -> None:
    a = block_hashes([1, 2, 3, 4, 5, 6, 7], 2)
    assert len(a) == 3
    b = block_hashes([1, 2, 3, 4, 9, 9], 2)
    assert b[:2] == a[:2] and b[2] != a[2]
    c = block_hashes([0, 2, 3, 4], 2)
    assert c[1] != a[1]  # same tokens in block 1, different parent


def test_prefix_blocks_are_reused_after_the_owner_finishes() -> None:
    kv = PagedKVCache(num_blocks=16, block_tokens=4)
    prompt = list(range(10))  # 2 full blocks + 2 tokens
    first = kv.allocate("a", prompt)
    assert first is not None and first.cached_tokens == 0 and first.blocks == 3
    kv.free("a")
    again = kv.allocate("b", [*range(8), 50, 51, 52])
    assert again is not None and again.cached_tokens == 8
    assert kv.stats.query_tokens == 21 and kv.stats.hit_tokens == 8
    assert 0 < kv.stats.hit_ratio < 1


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    kv = PagedKVCache(num_blocks=8, block_tokens=4)
    assert kv.allocate("a", list(range(8))) is not None
    second = kv.allocate("b", list(range(8)))  # shares blocks while "a" still runs
    assert second is not None and second.cached_tokens == 7


def test_lru_eviction_drops_the_least_recently_freed_prefix_first() -> None:
    kv = PagedKVCache(num_blocks=4, block_tokens=2)
    old, new = [1, 1, 1, 1], [2, 2, 2, 2]
    assert kv.allocate("old", old) is not None
    kv.free("old")
    assert kv.allocate("new", new) is not None
    kv.free("new")
    assert kv.cached_prefix_tokens(old) == 4 and kv.cached_prefix_tokens(new) == 4
    assert kv.allocate("x", [3, 3]) is not None  # needs one block: evicts old's tail
    assert kv.stats.evictions == 1
    assert kv.cached_prefix_tokens(old) == 2  # head block survives, tail evicted
    assert kv.cached_prefix_tokens(new) == 4
    assert kv.allocate("y", [4, 4, 4, 4]) is not None  # two more: old's head, then new's tail
    assert kv.cached_prefix_tokens(old) == 0
    assert kv.cached_prefix_tokens(new) == 2


def test_allocation_fails_cleanly_when_blocks_run_out() -> None:
    kv = PagedKVCache(num_blocks=3, block_tokens=2)
    assert kv.allocate("a", [1, 2, 3, 4]) is not None
    assert kv.allocate("b", [5, 6, 7, 8]) is None  # needs 2, one free
    assert kv.free_blocks == 1
    assert kv.blocks_of("b") == []


def test_append_grows_by_a_block_at_each_boundary_and_free_returns_blocks() -> None:
    kv = PagedKVCache(num_blocks=3, block_tokens=2)
    assert kv.allocate("a", [1, 2]) is not None
    assert kv.free_blocks == 2
    assert kv.append_token("a")  # 3rd token needs a new block
    assert kv.free_blocks == 1
    assert kv.append_token("a")
    assert kv.append_token("a")
    assert kv.free_blocks == 0
    assert kv.append_token("a")  # the 6th token still fits in the third block
    assert kv.can_append("a") is False
    assert kv.append_token("a") is False
    kv.free("a")
    assert kv.free_blocks == 3


def test_shared_blocks_are_refcounted() -> None:
    kv = PagedKVCache(num_blocks=8, block_tokens=2)
    assert kv.allocate("a", [1, 2, 3, 4, 5]) is not None
    assert kv.allocate("b", [1, 2, 3, 4, 6]) is not None
    assert kv.blocks_of("a")[:2] == kv.blocks_of("b")[:2]
    kv.free("a")
    assert kv.free_blocks == 8 - 3 - 1 + 1  # a's private tail is free, shared blocks held by b


def test_invalid_sizes_name_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        PagedKVCache(num_blocks=0)
    assert info.value.key == "kv_blocks"
