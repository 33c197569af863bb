"""Telemetry never breaks the host app: catch, count, log.

Every shim entry point that runs inside a user's request path is wrapped by
:func:`guarded` (or calls :meth:`TelemetryErrors.count` from an ``except`` block). The
first failure at each place is logged at WARNING, later ones at DEBUG, so a broken
exporter cannot flood the host's logs either.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

logger = logging.getLogger("tokenpath.instrumentation")

P = ParamSpec("P")
R = TypeVar("R")


class _PlaceCounts:
    """Counts per place; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def _increment(self, where: str) -> int:
        """Counts one at ``where``; returns the count before."""
        with self._lock:
            seen = self._counts.get(where, 0)
            self._counts[where] = seen + 1
        return seen

    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())

    def by_place(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()


class TelemetryErrors(_PlaceCounts):
    """Counts telemetry failures per place and logs them; never raises."""

    def count(self, where: str, exc: BaseException) -> None:
        try:
            seen = self._increment(where)
            level = logging.WARNING if seen == 0 else logging.DEBUG
            logger.log(level, "tokenpath telemetry error in %s (ignored): %r", where, exc)
        except Exception:  # pragma: no cover - logging itself failed
            pass


telemetry_errors = TelemetryErrors()


class TelemetryCounts(_PlaceCounts):
    """Counts events per place that are no failure (nothing logged); never raises."""

    def count(self, where: str) -> None:
        self._increment(where)


# Calls that took the public OpenTelemetry API path because the installed SDK is outside
# the range its fast path is tested on, by fast path (instrumentation/sdk_compat.py).
sdk_version_fallbacks = TelemetryCounts()


def guarded(where: str, default: R) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a telemetry function so any exception is counted and ``default`` returned."""

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return func(*args, **kwargs)
            except Exception as exc:
                telemetry_errors.count(where, exc)
                return default

        return wrapper

    return decorate
