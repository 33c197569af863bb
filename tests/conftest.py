"""Shared pytest fixtures. Shared fakes (in-memory span sink, fake NVML) live in testkit/fakes."""

from __future__ import annotations

import pytest

from tokenpath.compiled import stale_modules


def pytest_sessionstart(session: pytest.Session) -> None:
    """A compiled module older than its source would test the old code: stop at once."""
    stale = stale_modules()
    if stale:
        pytest.exit(f"compiled modules older than their source: {', '.join(stale)}; "
                    "run `make venv` to rebuild them (tokenpath/compiled.py)", returncode=4)
