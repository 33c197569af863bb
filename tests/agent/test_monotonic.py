from __future__ import annotations

from tokenpath.agent.monotonic import MonotonicCounters, MonotonicTotal


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


def test_single_total_reads_a_decrease_as_a_wrap_only_when_given_the_width() -> None:
    reset = MonotonicTotal()
    wrapped = MonotonicTotal()
    for raw in (2**32 - 10, 5):
        reset.update(raw)
        wrapped.update(raw, 2**32)
    assert reset.total == 2**32 - 10 + 5
    assert wrapped.total == 2**32 + 5
