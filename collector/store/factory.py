"""The store ``--store`` names, built: SQLite (collector/store/sqlite.py) or ClickHouse
(collector/store/clickhouse.py). The one module that chooses between the backends."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tokenpath.collector.stats import CollectorStats
from tokenpath.collector.store.base import Store, StoreConfig
from tokenpath.collector.store.clickhouse import ClickHouseStore
from tokenpath.collector.store.sqlite import RecordStore
from tokenpath.collector.store.url import is_clickhouse_url
from tokenpath.config import ConfigError


def make_store(config: StoreConfig, stats: CollectorStats | None = None,
               clock: Callable[[], float] = time.time) -> Store:
    """The store ``config.path`` names: a SQLite file (or ``:memory:``), or a ClickHouse
    URL (``chdb:///PATH``, ``clickhouse://``, ``clickhouses://``)."""
    if is_clickhouse_url(config.path):
        return ClickHouseStore(config, stats, clock)
    return RecordStore(config, stats, clock)


def open_store_readonly(path: str) -> Store:
    """A store for reading (CLI), opened read-only (nothing in the file changes, not even
    its schema); errors name the path when it does not exist."""
    if is_clickhouse_url(path):
        return ClickHouseStore(StoreConfig(path=path, read_only=True))
    if not Path(path).expanduser().exists():
        raise ConfigError("store", f"no store at {path}")
    return RecordStore(StoreConfig(path=path, read_only=True))
