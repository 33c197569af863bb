"""Per-engine block indexes and stored blocks by measured cause."""

from __future__ import annotations

from tokenpath import metric_names as mn
from tokenpath.agent.kv_index import (
    CAUSE_ALREADY_HELD,
    CAUSE_COLD,
    CAUSE_EVICTED,
    CAUSE_ROUTED,
    DROP_INDEX_FULL,
    KvTracker,
)
from tokenpath.agent.kv_wire import CLEARED_EVENT, KvBatch, KvEvent, Removed, Stored
from tokenpath.agent.snapshot import Points

A, B = "engine-a", "engine-b"


def stored(*hashes: int, size: int = 32, group: int = 0, medium: str = "GPU") -> Stored:
    return Stored(tuple(h.to_bytes(32, "big") for h in hashes), size, group, medium)


def removed(*hashes: int, group: int = 0, medium: str = "GPU") -> Removed:
    return Removed(tuple(h.to_bytes(32, "big") for h in hashes), group, medium)


def apply(tracker: KvTracker, engine: str, ts: float, *events: KvEvent) -> None:
    tracker.apply(engine, KvBatch(ts, events))


def series(tracker: KvTracker, spec: mn.MetricSpec) -> dict[tuple[str, ...], float]:
    points: Points = {}
    tracker.add_to(points)
    return points.get(spec, {})


def blocks(tracker: KvTracker, engine: str, model: str = mn.UNKNOWN) -> dict[str, float]:
    values = series(tracker, mn.KV_STORED_BLOCKS)
    return {cause: value for (e, m, cause), value in values.items()
            if e == engine and m == model and value}


def test_first_store_is_cold_and_a_second_engine_of_the_model_is_routed() -> None:
    tracker = KvTracker(models={A: "m", B: "m"})
    apply(tracker, A, 1.0, stored(1, 2, 3))
    apply(tracker, B, 2.0, stored(1, 2, 9))
    assert blocks(tracker, A, "m") == {CAUSE_COLD: 3}
    assert blocks(tracker, B, "m") == {CAUSE_ROUTED: 2, CAUSE_COLD: 1}
    tokens = series(tracker, mn.KV_RECOMPUTED_TOKENS)
    assert tokens[(B, "m", CAUSE_ROUTED)] == 64 and tokens[(B, "m", CAUSE_COLD)] == 32


def test_engines_of_other_models_do_not_make_a_block_routed() -> None:
    tracker = KvTracker(models={A: "m1", B: "m2"})
    apply(tracker, A, 1.0, stored(1))
    apply(tracker, B, 1.0, stored(1))
    assert blocks(tracker, B, "m2") == {CAUSE_COLD: 1}


def test_a_block_stored_again_after_its_removal_is_evicted_with_the_time_it_was_gone() -> None:
    tracker = KvTracker()
    apply(tracker, A, 10.0, stored(1, 2))
    apply(tracker, A, 14.0, removed(1))
    apply(tracker, A, 20.0, stored(1))
    assert blocks(tracker, A) == {CAUSE_COLD: 2, CAUSE_EVICTED: 1}
    assert series(tracker, mn.KV_EVICTED_GONE_SECONDS)[(A, mn.UNKNOWN)] == 6.0
    assert series(tracker, mn.KV_BLOCK_LIFETIME_SECONDS)[(A, mn.UNKNOWN)] == 4.0
    assert series(tracker, mn.KV_REMOVED_BLOCKS)[(A, mn.UNKNOWN)] == 1.0


def test_evicted_wins_over_routed() -> None:
    tracker = KvTracker()
    apply(tracker, A, 1.0, stored(1), removed(1))
    apply(tracker, B, 1.0, stored(1))  # B holds it now: routed for B
    apply(tracker, A, 2.0, stored(1))
    assert blocks(tracker, A) == {CAUSE_COLD: 1, CAUSE_EVICTED: 1}
    assert blocks(tracker, B) == {CAUSE_COLD: 1}


def test_a_removal_of_a_block_stored_before_the_agent_watched_still_makes_it_evicted() -> None:
    tracker = KvTracker()
    apply(tracker, A, 5.0, removed(4))
    apply(tracker, A, 6.0, stored(4))
    assert blocks(tracker, A) == {CAUSE_EVICTED: 1}


def test_re_stores_of_held_blocks_are_already_held_and_duplicates_balance() -> None:
    tracker = KvTracker()
    apply(tracker, A, 1.0, stored(1), stored(1))  # two physical copies of one hash
    assert blocks(tracker, A) == {CAUSE_COLD: 1, CAUSE_ALREADY_HELD: 1}
    apply(tracker, A, 2.0, removed(1))  # one copy goes: still held
    apply(tracker, A, 3.0, stored(1))
    assert blocks(tracker, A) == {CAUSE_COLD: 1, CAUSE_ALREADY_HELD: 2}
    apply(tracker, A, 4.0, removed(1), removed(1))  # both go
    assert series(tracker, mn.KV_RESIDENT_BLOCKS)[(A, mn.UNKNOWN)] == 0
    apply(tracker, A, 5.0, stored(1))
    assert blocks(tracker, A) == {CAUSE_COLD: 1, CAUSE_ALREADY_HELD: 2, CAUSE_EVICTED: 1}
    assert "already_held" not in {cause for (_, _, cause) in
                                  series(tracker, mn.KV_RECOMPUTED_TOKENS)}


def test_groups_and_mediums_are_indexed_apart_and_only_gpu_stores_count() -> None:
    tracker = KvTracker()
    apply(tracker, A, 1.0, stored(1, group=0), stored(1, group=1))
    assert blocks(tracker, A) == {CAUSE_COLD: 2}
    apply(tracker, A, 2.0, stored(1, medium="CPU"))  # an offload copy: not computed here
    assert blocks(tracker, A) == {CAUSE_COLD: 2}
    assert series(tracker, mn.KV_RESIDENT_BLOCKS)[(A, mn.UNKNOWN)] == 3
    apply(tracker, A, 3.0, removed(1, medium="CPU"))
    apply(tracker, A, 4.0, stored(1, group=1))
    assert blocks(tracker, A) == {CAUSE_COLD: 2, CAUSE_ALREADY_HELD: 1}


def test_all_blocks_cleared_resets_the_engine_index() -> None:
    tracker = KvTracker()
    apply(tracker, A, 1.0, stored(1), removed(1), stored(2))
    apply(tracker, A, 2.0, CLEARED_EVENT)
    assert series(tracker, mn.KV_RESIDENT_BLOCKS)[(A, mn.UNKNOWN)] == 0
    assert series(tracker, mn.KV_INDEX_RESETS)[(A, mn.UNKNOWN)] == 1
    apply(tracker, A, 3.0, stored(1, 2))
    assert blocks(tracker, A) == {CAUSE_COLD: 4}


def test_the_index_is_bounded_and_blocks_past_it_are_counted_dropped() -> None:
    tracker = KvTracker(max_blocks=3)
    apply(tracker, A, 1.0, stored(1, 2, 3, 4, 5))
    assert series(tracker, mn.KV_RESIDENT_BLOCKS)[(A, mn.UNKNOWN)] == 3
    assert series(tracker, mn.KV_EVENTS_DROPPED)[(A, DROP_INDEX_FULL)] == 2
    apply(tracker, A, 2.0, removed(*range(10, 20)))  # removal history is bounded too
    apply(tracker, A, 3.0, removed(1, 2), stored(10, 19))
    assert blocks(tracker, A) == {CAUSE_COLD: 4, CAUSE_EVICTED: 1}


def test_engine_labels_are_bounded() -> None:
    tracker = KvTracker(max_engines=2)
    for n in range(4):
        apply(tracker, f"engine-{n}", 1.0, stored(n))
    engines = {engine for (engine, _, _) in series(tracker, mn.KV_STORED_BLOCKS)}
    assert engines == {"engine-0", "engine-1", mn.OTHER_LABEL_VALUE}


def test_integer_and_byte_hashes_are_told_apart_by_value() -> None:
    tracker = KvTracker()
    apply(tracker, A, 1.0, Stored((1, 2), 16, 0, "GPU"))
    apply(tracker, A, 2.0, Removed((1,), 0, "GPU"), Stored((1, 2**63, -5), 16, 0, "GPU"))
    assert blocks(tracker, A) == {CAUSE_COLD: 4, CAUSE_EVICTED: 1}


def test_a_batch_larger_than_one_lock_hold_is_applied_whole_and_in_order() -> None:
    from tokenpath.agent.kv_index import BLOCKS_PER_LOCK

    tracker = KvTracker()
    many = range(BLOCKS_PER_LOCK * 2 + 5)
    apply(tracker, A, 1.0, stored(*many), removed(*many), stored(*many))
    assert blocks(tracker, A) == {CAUSE_COLD: len(many), CAUSE_EVICTED: len(many)}
    assert series(tracker, mn.KV_RESIDENT_BLOCKS)[(A, mn.UNKNOWN)] == len(many)


def test_groups_per_engine_are_bounded_and_the_removal_history_across_them() -> None:
    from tokenpath.agent.kv_index import MAX_GROUPS_PER_ENGINE

    tracker = KvTracker(max_blocks=4)
    for group in range(MAX_GROUPS_PER_ENGINE + 3):
        apply(tracker, A, 1.0, removed(1, 2, group=group))
    dropped = series(tracker, mn.KV_EVENTS_DROPPED)[(A, DROP_INDEX_FULL)]
    assert dropped == 3 * 2  # the groups past the cap: their blocks are not indexed
    index = next(iter(tracker.engines()))
    assert index.remembered_removals == 4
    assert len(index.held) == MAX_GROUPS_PER_ENGINE
