"""Shared pytest fixtures. Shared fakes (in-memory span sink, fake NVML) live in testkit/fakes."""

from __future__ import annotations

import os

import pytest

from tokenpath.compiled import stale_modules

# pytest-xdist's workers start with COLUMNS=80 in their environment, where a plain pytest
# run has none: the CLI's console (tokenpath/cli/common.py) and every CLI subprocess would
# fold their output at 80 columns instead of the piped width a user's `| tee` gets.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)


def pytest_sessionstart(session: pytest.Session) -> None:
    """A compiled module older than its source would test the old code: stop at once."""
    stale = stale_modules()
    if stale:
        pytest.exit(f"compiled modules older than their source: {', '.join(stale)}; "
                    "run `make venv` to rebuild them (tokenpath/compiled.py)", returncode=4)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules that start processes or servers (marked integration) run first, in their
    collection order: under pytest-xdist (``make test`` runs one worker a core, a module to
    a worker) the minutes-long ones then start early and the short ones fill in at the end,
    so the workers finish together. Stable: a module's own tests keep their order."""
    slow = {item.path for item in items if item.get_closest_marker("integration")}
    items.sort(key=lambda item: item.path not in slow)
