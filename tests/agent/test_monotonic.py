from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tokenpath.agent.monotonic import CounterGroup, MonotonicCounters


def test_increases_accumulate_and_first_sighting_starts_at_raw() -> None:
    counters = MonotonicCounters()
    assert counters.update("a", 100.0) == 100.0
    assert counters.update("a", 150.0) == 150.0


def test_reset_never_goes_backwards() -> None:
    counters = MonotonicCounters()
    counters.update("a", 100.0)
    counters.update("a", 150.0)
    # Reset to zero then counted 20 again.
    assert counters.update("a", 20.0) == 170.0
    assert counters.update("a", 25.0) == 175.0
    assert counters.resets == 1


def test_nan_and_negative_are_ignored() -> None:
    counters = MonotonicCounters()
    counters.update("a", 10.0)
    assert counters.update("a", float("nan")) == 10.0
    assert counters.update("a", -5.0) == 10.0
    assert counters.update("a", 12.0) == 12.0


def test_key_cap_refuses_new_keys() -> None:
    counters = MonotonicCounters(max_keys=2)
    counters.update("a", 1.0)
    counters.update("b", 1.0)
    assert counters.update("c", 1.0) is None
    assert counters.refused == 1
    assert counters.update("a", 2.0) == 2.0


def test_group_reads_a_decrease_as_a_wrap_only_for_counters_with_a_width() -> None:
    group = CounterGroup(widths=(2**32, 0))
    assert group.update((2**32 - 10, 100)) == (2**32 - 10, 100)
    # Counter 0 wrapped (15 more), counter 1 was reset and counted 5 since.
    assert group.update((5, 5)) == (2**32 + 5, 105)
    assert group.update((25, 6)) == (2**32 + 25, 106)


@given(st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 2**40)), min_size=1,
                max_size=30))
def test_group_totals_never_go_backwards_and_equal_raws_until_a_decrease(
        readings: list[tuple[int, int]]) -> None:
    group = CounterGroup()
    previous: tuple[float, ...] | None = None
    decreased = False
    for index, raws in enumerate(readings):
        totals = group.update(raws)
        if index and any(raw < last for raw, last in zip(raws, readings[index - 1], strict=True)):
            decreased = True
        if not decreased:
            assert totals == raws
        if previous is not None:
            assert all(now >= before for now, before in zip(totals, previous, strict=True))
        previous = totals


def test_a_32_bit_counter_that_drops_from_low_was_reset_not_wrapped() -> None:
    group = CounterGroup(widths=(2**32,))
    group.update((1_000,))
    # A wrap from 1,000 would mean 4 GiB in one reading: a device reset is the reading.
    assert group.update((10,)) == (1_010,)


def test_a_selected_group_keeps_the_chosen_counters_history() -> None:
    group = CounterGroup(widths=(0, 2**32, 0))
    group.update((100, 2**32 - 10, 7))
    group.update((50, 2**32 - 5, 9))  # counter 0 reset: offset 100
    kept = group.select((0, 1))
    assert kept.widths == (0, 2**32)
    # Counter 1 wraps (its width came along); counter 0 keeps its offset.
    assert kept.update((60, 5)) == (160, 2**32 + 5)
    fresh = CounterGroup().select((1,))
    assert fresh.update((3,)) == (3,)
