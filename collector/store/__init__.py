"""The store (interim)."""

from tokenpath.collector.store.base import RecordStore, Store, StoreConfig
from tokenpath.collector.store.factory import make_store, open_store_readonly

__all__ = ["RecordStore", "Store", "StoreConfig", "make_store", "open_store_readonly"]
