"""A clock the test moves by hand: what components take as ``clock=`` (a callable giving
seconds), so a test waits for nothing."""

from __future__ import annotations


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
