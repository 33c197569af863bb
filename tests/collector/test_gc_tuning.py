"""The collector process's garbage-collector settings (collector/gc_tuning.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from tokenpath.collector.config import CollectorConfig
from tokenpath.collector.gc_tuning import DEFAULT_GC_YOUNG_THRESHOLD, tune_gc


@pytest.fixture
def restored_gc() -> Iterator[None]:
    before = gc.get_threshold()
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


def test_the_young_threshold_is_raised_and_the_rest_kept(restored_gc: None) -> None:
    _, older, oldest = gc.get_threshold()
    tune_gc(DEFAULT_GC_YOUNG_THRESHOLD)
    assert gc.get_threshold() == (DEFAULT_GC_YOUNG_THRESHOLD, older, oldest)
    assert gc.get_freeze_count() > 0  # what the started process holds is left out


def test_zero_keeps_pythons_own(restored_gc: None) -> None:
    before = gc.get_threshold()
    tune_gc(0)
    assert gc.get_threshold() == before


def test_the_config_file_sets_it(tmp_path: Path) -> None:
    config = CollectorConfig.from_sources(store=str(tmp_path / "s.db"),
                                          file={"gc_young_threshold": 0})
    assert config.gc_young_threshold == 0
    assert CollectorConfig.from_sources(store=str(tmp_path / "s.db")
                                        ).gc_young_threshold == DEFAULT_GC_YOUNG_THRESHOLD
