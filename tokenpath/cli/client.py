"""Where the client commands read from: a store file or a live collector's API."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tokenpath.cli.common import auth_token, fail
from tokenpath.collector.api_views import MAX_API_LIMIT
from tokenpath.config import ConfigError, parse_duration
from tokenpath.query import RecordQueries
from tokenpath.records import RequestRecord

if TYPE_CHECKING:
    from tokenpath.collector.store.base import Store


@dataclass(frozen=True, slots=True)
class Source:
    """``collector`` may name several replicas, comma-separated: their records are merged
    (each record lives on the one replica that priced it)."""

    store: str | None
    collector: str | None

    @property
    def collectors(self) -> list[str]:
        return [u.strip() for u in (self.collector or "").split(",") if u.strip()]

    def _get(self, base: str, path: str, params: dict[str, Any]) -> Any:
        import httpx  # the --collector path alone (a --store command starts without it)

        headers = {}
        token = auth_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        url = base.rstrip("/") + path
        try:
            response = httpx.get(url, params=params, headers=headers, timeout=30)
        except httpx.HTTPError as exc:
            fail(f"--collector: cannot reach {base}: {exc}")
        if response.status_code == 401:
            fail("--collector: unauthorized (set TOKENPATH_AUTH_TOKEN)")
        if response.status_code != 200:
            fail(f"--collector: {url} answered {response.status_code}: {response.text[:200]}")
        return response.json()

    def records(self, limit: int | None, since: str | None) -> list[RequestRecord]:
        """The newest ``limit`` records (all with ``None``), from the store or, page by
        page, from the collector."""
        if self.collectors:
            return self._merged(limit, since)
        store = self._open()
        try:
            return store.records(limit=limit, since_unix=_since_unix(since))
        finally:
            store.shutdown()

    def _merged(self, limit: int | None, since: str | None) -> list[RequestRecord]:
        merged: dict[str, dict[str, Any]] = {}
        for base in self.collectors:
            for r in self._collector_records(base, limit, since):
                merged.setdefault(r.get("record_id") or r["trace_id"], r)
        newest = sorted(merged.values(), key=lambda r: r.get("end_unix") or 0.0,
                        reverse=True)
        return [RequestRecord.from_json(r) for r in
                (newest if limit is None else newest[:limit])]

    def _collector_records(self, base: str, limit: int | None,
                           since: str | None) -> list[dict[str, Any]]:
        """Pages of at most MAX_API_LIMIT, each of records that ended at or before the
        oldest of the page before (``until``); records seen twice at a page boundary are
        kept once."""
        out: list[dict[str, Any]] = []
        seen: set[str] = set()
        params: dict[str, Any] = {}
        if since:
            params["since"] = since
        while limit is None or len(out) < limit:
            # One more than still wanted after the first page: the boundary record again.
            wanted = MAX_API_LIMIT if limit is None else limit - len(out) + (1 if out else 0)
            params["limit"] = min(MAX_API_LIMIT, wanted)
            page = self._get(base, "/api/requests", params)
            fresh = [r for r in page if (r.get("record_id") or r["trace_id"]) not in seen]
            seen.update(r.get("record_id") or r["trace_id"] for r in fresh)
            out.extend(fresh)
            # A short page is the last; a page of nothing new means more than a page of
            # records ended at one instant (not seen in practice): stop rather than loop.
            if len(page) < params["limit"] or not fresh:
                break
            params["until"] = page[-1]["end_unix"]
        return out if limit is None else out[:limit]

    @contextmanager
    def queries(self) -> Iterator[RecordQueries]:
        """What the views read: the collectors' aggregates (``--collector``, merged,
        tokenpath/cli/remote.py) or the store file; closed after. A collector that cannot
        be read ends the command with a message naming it."""
        if self.collectors:
            from tokenpath.cli.remote import RemoteError, RemoteQueries  # httpx, as above

            remote = RemoteQueries(self.collectors, auth_token())
            try:
                yield remote
            except RemoteError as exc:
                fail(f"--collector: {exc}")
            finally:
                remote.close()
            return
        store = self._open()
        try:
            yield store
        finally:
            store.shutdown()

    def _open(self) -> Store:
        from tokenpath.collector.store.factory import open_store_readonly
        from tokenpath.collector.store.url import default_store_path

        try:
            return open_store_readonly(self.store or default_store_path())
        except ConfigError as exc:
            fail(f"--store: {exc.message}")


def since_unix(since: str | None) -> float | None:
    """``--since DURATION`` as a unix time (None: no bound)."""
    return _since_unix(since)


def _since_unix(since: str | None) -> float | None:
    if since is None:
        return None
    try:
        return time.time() - parse_duration(since, "since")
    except ConfigError as exc:
        fail(f"--since: {exc}")
