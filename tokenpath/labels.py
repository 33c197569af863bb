"""Bounded label values, shared by the collector's and the agent's metrics (docs/reference.md:
labels are bounded; values past the cap become ``other``, and the overflow is counted)."""

from __future__ import annotations

import threading

from tokenpath.metric_names import OTHER_LABEL_VALUE, UNKNOWN

UNKNOWN_LABEL_VALUE = UNKNOWN


class BoundedLabel:
    """Admits at most ``cap`` distinct values of one label; later ones become ``other``.

    ``name`` (the label's name) lets an overflow counter say which label overflowed.
    """

    def __init__(self, cap: int, name: str = "") -> None:
        self.name = name
        self._cap = cap
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self.overflowed = 0

    def __call__(self, value: str | None) -> str:
        value = value or UNKNOWN_LABEL_VALUE
        if value in self._seen:
            return value
        with self._lock:
            if len(self._seen) < self._cap:
                self._seen.add(value)
                return value
            self.overflowed += 1
        return OTHER_LABEL_VALUE
