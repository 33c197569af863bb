from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from testkit.fakes.clock import FakeClock
from tokenpath.collector.cost.attributor import AttributorConfig, CostAttributor
from tokenpath.collector.cost.cache import HeavyHitters, PrefixCacheTracker
from tokenpath.collector.cost.prices import load_price_sheet
from tokenpath.collector.cost.stepsim import SimRequest, simulate
from tokenpath.roofline import roofline_for
from tokenpath.stages import Phase

from .helpers import RecordingSink, engine_record

ROOFLINE = roofline_for("H100-SXM", "llama-3.1-8b")
PRICES = load_price_sheet()


def test_heavy_hitters_stay_bounded_and_keep_the_heavy_prefix() -> None:
    sketch = HeavyHitters(capacity=4)
    for i in range(200):
        sketch.update("system-prompt", 512, hit=i % 2 == 0, waste=0.01)
        sketch.update(f"one-off-{i}", 16, hit=False, waste=0.0)
    assert len(sketch) == 4
    top = sketch.top_by_waste(1)[0]
    assert top.fingerprint == "system-prompt"
    assert top.count >= 200 and top.hits == 100 and top.misses == 100
    assert abs(top.waste_dollars - 2.0) < 1e-9


def _prompt(system: str, user: str, blocks: int, system_blocks: int) -> tuple[str, ...]:
    return tuple(f"{system}{b}" if b < system_blocks else f"{user}{b}" for b in range(blocks))


def test_recomputed_prefix_that_was_seen_recently_is_waste() -> None:
    tracker = PrefixCacheTracker(block_tokens=16, ttl_seconds=60, heavy_hitter_capacity=8)
    first = engine_record(0, 10.0, 0.1, 1.0, input_tokens=160, cached_tokens=0)
    first.prefix_fingerprints = _prompt("s", "u1-", 10, 8)
    assert tracker.observe(first, prefill_dollars=1.0, roofline=ROOFLINE) == 0.0  # never seen

    missed = engine_record(1, 20.0, 0.1, 1.0, input_tokens=160, cached_tokens=0)
    missed.prefix_fingerprints = _prompt("s", "u2-", 10, 8)
    waste = tracker.observe(missed, prefill_dollars=1.0, roofline=ROOFLINE)
    # 128 of 160 tokens were seen 10 s before and recomputed
    assert 0.7 < waste < 0.85

    hit = engine_record(2, 30.0, 0.1, 1.0, input_tokens=160, cached_tokens=128)
    hit.prefix_fingerprints = _prompt("s", "u3-", 10, 8)
    assert tracker.observe(hit, prefill_dollars=0.2, roofline=ROOFLINE) == 0.0

    stale = engine_record(3, 500.0, 0.1, 1.0, input_tokens=160, cached_tokens=0)
    stale.prefix_fingerprints = _prompt("s", "u4-", 10, 8)
    assert tracker.observe(stale, prefill_dollars=1.0, roofline=ROOFLINE) == 0.0  # past TTL

    top = tracker.top_by_waste(1)[0]
    assert top.fingerprint == "s7" and top.prefix_tokens == 128
    assert (top.hits, top.misses) == (1, 1)


def test_the_block_size_the_engine_sent_wins_over_the_configured_one() -> None:
    # Engine hooks fingerprint 64-token blocks by default and say so on the span; a
    # prompt of 1,024 tokens seen whole and recomputed whole is all waste.
    tracker = PrefixCacheTracker(block_tokens=16, ttl_seconds=60)
    seen = engine_record(0, 10.0, 0.1, 1.0, input_tokens=1024, cached_tokens=0)
    seen.prefix_fingerprints = _prompt("s", "", 16, 16)
    seen.prefix_block_tokens = 64
    tracker.observe(seen, prefill_dollars=1.0, roofline=None)
    again = engine_record(1, 20.0, 0.1, 1.0, input_tokens=1024, cached_tokens=0)
    again.prefix_fingerprints = seen.prefix_fingerprints
    again.prefix_block_tokens = 64
    assert tracker.seen_prefix_tokens(again, 20.0) == (1024, 15)
    assert tracker.observe(again, prefill_dollars=1.0, roofline=None) == 1.0
    unsized = engine_record(2, 30.0, 0.1, 1.0, input_tokens=1024, cached_tokens=0)
    unsized.prefix_fingerprints = seen.prefix_fingerprints  # no block size: the default
    assert tracker.seen_prefix_tokens(unsized, 30.0) == (256, 15)


def test_attributor_sets_miss_waste_on_records() -> None:
    sink = RecordingSink()
    cost = CostAttributor(sink, PRICES, clock=FakeClock(),
                          config=AttributorConfig(tick_seconds=0))
    for i, (start, cached) in enumerate(((0.0, 0), (5.0, 0))):
        record = engine_record(i, start, 0.2, 1.0, input_tokens=2048, cached_tokens=cached)
        record.prefix_fingerprints = _prompt("sys", f"u{i}-", 128, 100)
        cost.consume_record(record)
    cost.shutdown()
    first, second = sorted(sink.records, key=lambda r: r.prefill_start_unix or 0)
    assert first.cache_miss_waste_dollars == 0.0
    prefill = second.stages
    assert 0 < second.cache_miss_waste_dollars < sum(
        t.phases[Phase.PREFILL].cost_dollars for t in prefill.values() if Phase.PREFILL in t.phases)
    assert cost.cache.waste_dollars == second.cache_miss_waste_dollars


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 30_000), st.floats(0, 1), st.floats(0, 1))
def test_more_cache_hits_never_raise_prefill_cost(input_tokens: int, low: float,
                                                  extra: float) -> None:
    """Same request alone on a node, timed by the step simulator, with more cached tokens:
    its attributed prefill dollars never go up."""
    cached_low = int((input_tokens - 1) * low)
    cached_high = min(input_tokens - 1, cached_low + int((input_tokens - 1) * extra))

    def prefill_dollars(cached: int) -> float:
        request = SimRequest("f" * 32, 0.0, input_tokens, cached, 4)
        result = simulate([request], ROOFLINE, PRICES.gpus["H100-SXM"].dollars_per_second)
        sink = RecordingSink()
        cost = CostAttributor(sink, PRICES, clock=FakeClock(),
                              config=AttributorConfig(tick_seconds=0))
        cost.consume_record(result.records[0])
        cost.shutdown()
        return sum(t.phases[Phase.PREFILL].cost_dollars
                   for t in sink.records[0].stages.values() if Phase.PREFILL in t.phases)

    assert prefill_dollars(cached_high) <= prefill_dollars(cached_low) * (1 + 1e-12)


def test_top_prefixes_replay_stored_records_in_engine_order() -> None:
    sink = RecordingSink()
    cost = CostAttributor(sink, PRICES, clock=FakeClock(),
                          config=AttributorConfig(tick_seconds=0))
    for i in range(6):
        record = engine_record(i, 10.0 * i, 0.2, 1.0, input_tokens=2048,
                               cached_tokens=1600 if i % 2 else 0)
        record.prefix_fingerprints = _prompt("sys", f"u{i}-", 128, 100)
        cost.consume_record(record)
    cost.shutdown()
    from tokenpath.collector.cost.cache import top_prefixes_by_waste

    top = top_prefixes_by_waste(list(reversed(sink.records)), limit=3)
    assert [p.fingerprint for p in top] == ["sys99"]
    assert (top[0].hits, top[0].misses) == (3, 2)  # the first sighting is neither
    assert abs(top[0].waste_dollars - cost.cache.waste_dollars) < 1e-12


def _on(node: str, index: int, at: float, cached: int, prompt: tuple[str, ...],
        input_tokens: int = 160):  # type: ignore[no-untyped-def]
    record = engine_record(index, at, 0.1, 1.0, node=node, input_tokens=input_tokens,
                           cached_tokens=cached)
    record.prefix_fingerprints = prompt
    return record


def test_each_recomputed_block_has_its_cause_and_the_waste_causes_sum_to_the_waste() -> None:
    from tokenpath.leaks import MissCause

    tracker = PrefixCacheTracker(block_tokens=16, ttl_seconds=60)
    first = _on("node-a", 0, 10.0, 0, _prompt("s", "u1-", 10, 8))
    assert tracker.observe(first, 1.0, ROOFLINE) == 0.0
    # never seen: all ten fingerprinted blocks are its first prefill
    assert first.miss_tokens == {MissCause.COLD.value: 160}
    assert first.miss_dollars[MissCause.COLD.value] > 0.9

    # the same system prompt on another engine: its 8 blocks were routed elsewhere
    routed = _on("node-b", 1, 20.0, 0, _prompt("s", "u2-", 10, 8))
    waste = tracker.observe(routed, 1.0, ROOFLINE)
    assert routed.miss_tokens == {MissCause.ROUTED_ELSEWHERE.value: 128,
                                  MissCause.COLD.value: 32}
    assert waste == routed.miss_dollars[MissCause.ROUTED_ELSEWHERE.value] > 0.7

    # back on the first engine, recomputed: evicted there
    evicted = _on("node-a", 2, 30.0, 0, _prompt("s", "u3-", 10, 8))
    tracker.observe(evicted, 1.0, ROOFLINE)
    assert evicted.miss_tokens[MissCause.EVICTED.value] == 128

    # served from cache but for the last seen block: sub-block, not an eviction
    near = _on("node-a", 3, 40.0, 112, _prompt("s", "u4-", 10, 8))
    waste = tracker.observe(near, 0.3, ROOFLINE)
    assert near.miss_tokens == {MissCause.SUB_BLOCK.value: 16, MissCause.COLD.value: 32}
    assert waste == near.miss_dollars[MissCause.SUB_BLOCK.value] > 0
    # dollars by cause never exceed the prefill they split
    for record in (first, routed, evicted, near):
        assert sum(record.miss_dollars.values()) <= 1.0 + 1e-9


def test_a_prefix_seen_on_this_engine_and_another_splits_at_what_this_engine_saw() -> None:
    from tokenpath.leaks import MissCause

    tracker = PrefixCacheTracker(block_tokens=16, ttl_seconds=60)
    tracker.observe(_on("node-a", 0, 10.0, 0, _prompt("s", "a-", 10, 4)), 1.0, None)
    tracker.observe(_on("node-b", 1, 11.0, 0, _prompt("s", "b-", 10, 8)), 1.0, None)
    again = _on("node-a", 2, 12.0, 0, _prompt("s", "b-", 10, 8))
    tracker.observe(again, 1.0, None)
    # blocks 0-3 were on node-a (evicted there), 4-9 only on node-b
    assert again.miss_tokens == {MissCause.EVICTED.value: 64,
                                 MissCause.ROUTED_ELSEWHERE.value: 96}
    assert again.miss_dollars[MissCause.EVICTED.value] == 64 / 160  # token share


def test_an_eviction_is_an_eviction_whatever_order_the_records_close_in() -> None:
    """Records reach the tracker in close order: a short request prefilled later on the
    same engine closes before a long one prefilled earlier. The block was still on this
    engine first: evicted, not routed elsewhere."""
    from tokenpath.leaks import MissCause

    tracker = PrefixCacheTracker(block_tokens=16, ttl_seconds=60)
    prompt = _prompt("s", "x-", 10, 8)
    tracker.observe(_on("node-a", 0, 0.0, 0, prompt), 1.0, None)   # a: first
    tracker.observe(_on("node-a", 1, 5.0, 0, prompt), 1.0, None)   # c: closes second
    late = _on("node-a", 2, 3.0, 0, prompt)                        # b: prefilled at 3
    tracker.observe(late, 1.0, None)
    assert MissCause.ROUTED_ELSEWHERE.value not in late.miss_tokens
    assert late.miss_tokens[MissCause.EVICTED.value] == 160
