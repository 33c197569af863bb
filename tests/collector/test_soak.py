"""The bounded soak (bench/soak.py): flat collector memory under mixed traffic.

Excluded from ``make test`` (marker ``soak``). Run: ``.venv/bin/pytest -m soak
tests/collector/test_soak.py``; ``TOKENPATH_SOAK_SECONDS`` shortens the 10-minute default.
"""

from __future__ import annotations

import os

import pytest

from bench.soak import DEFAULT_DURATION, ENV_DURATION, run

pytestmark = [pytest.mark.soak, pytest.mark.timeout(3600)]


def test_memory_stays_flat_under_mixed_traffic() -> None:
    result = run(float(os.environ.get(ENV_DURATION, DEFAULT_DURATION)))
    summary = result.to_json()
    assert summary["responses"].get("http:200", 0) > 0
    assert not any(key.startswith("http:5") for key in summary["responses"]), summary
    assert result.records_stored > 0
    assert result.passed, summary
