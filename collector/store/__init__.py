"""The store: request records and idle cost, kept for the views, the API and the CLI.

- ``base``: what every store is (``StoreConfig``, ``Store``, ``StoreQueries``);
- ``sqlite`` (``RecordStore``) and ``sqlite_sql``: the embedded SQLite store, its rollups
  and queries;
- ``clickhouse``, ``clickhouse_client``, ``clickhouse_sql``, ``clickhouse_rollups``: the
  ClickHouse store (a server, or chDB in-process);
- ``layout`` (the record row both keep), ``measures`` (the views' measures in SQL, both
  dialects), ``url`` (what ``--store`` names) and ``factory`` (the store it names).

The modules of the package import each other by their own names (never this one's), so
none of them depends on what this file re-exports.
"""

from tokenpath.collector.store.base import Store, StoreConfig, StoreQueries
from tokenpath.collector.store.factory import make_store, open_store_readonly
from tokenpath.collector.store.sqlite import RecordStore

__all__ = ["RecordStore", "Store", "StoreConfig", "StoreQueries", "make_store",
           "open_store_readonly"]
