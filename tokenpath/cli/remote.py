"""``RemoteQueries``: the read interface (tokenpath/query.py) over running collectors.

``tokenpath report|chargeback|whatif --collector URL[,URL...]`` compute their views
(tokenpath/views.py) on this exactly as on a store file: each collector answers mergeable
aggregates (``GET /api/aggregate``, collector/api_aggregate.py) and this sums them, merges
their histograms (percentiles are read off the merged histogram) and unions their sets.
Views that need records take a sample capped in total (``/api/sample``: each collector's
newest ``limit``, the newest ``limit`` of all kept). So what crosses the network grows with
the number of collectors and groups, never with the records in the window.

Collectors that share one store (replicas on one ClickHouse database) answer for the same
records: an answer whose ``store`` was already heard in the same call is skipped.

Thread contract: one caller at a time (the CLI's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from tokenpath.query import (
    DEFAULT_PARAMS,
    Aggregates,
    Coverage,
    GroupBy,
    Params,
    Sample,
    Window,
    merge_groups,
)
from tokenpath.query_wire import (
    WireError,
    group_by_param,
    names_param,
    params_param,
    parse_aggregates,
    parse_coverage,
    window_params,
)
from tokenpath.records import RequestRecord

DEFAULT_TIMEOUT_SECONDS = 120.0
MAX_RECORDS = 50_000  # records() is a bounded list: the collectors' /api/sample cap


class RemoteError(Exception):
    """A collector could not be read; the message names it."""


class RemoteQueries:
    """RecordQueries answered by the collectors at ``urls`` (see the module doc)."""

    def __init__(self, urls: Sequence[str], token: str | None = None,
                 client: httpx.Client | None = None,
                 timeout: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        if not urls:
            raise ValueError("no collector URL")
        self._urls = [u.rstrip("/") for u in urls]
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = client or httpx.Client(timeout=timeout, headers=headers)
        self.bytes_received = 0  # what the answers weighed (the bench and tests read it)

    def close(self) -> None:
        self._client.close()

    def shutdown(self) -> None:
        """The stores' name for :meth:`close` (the CLI closes either the same way)."""
        self.close()

    def _answers(self, path: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """One answer per distinct store, in the order of ``urls``."""
        out: list[dict[str, Any]] = []
        stores: set[str] = set()
        for base in self._urls:
            try:
                response = self._client.get(base + path, params=params)
            except httpx.HTTPError as exc:
                raise RemoteError(f"cannot reach {base}: {exc}") from exc
            if response.status_code == 401:
                raise RemoteError(f"{base}: unauthorized (set TOKENPATH_AUTH_TOKEN)")
            if response.status_code != 200:
                raise RemoteError(f"{base}{path} answered {response.status_code}: "
                                  f"{response.text[:200]}")
            self.bytes_received += len(response.content)
            answer = response.json()
            store = str(answer.get("store", base))
            if store in stores:
                continue
            stores.add(store)
            out.append(answer)
        return out

    # --- RecordQueries ---------------------------------------------------------------------

    def aggregate(self, window: Window, measures: Sequence[str],
                  histograms: Sequence[str] = (), group_by: GroupBy = None,
                  params: Params = DEFAULT_PARAMS) -> dict[Any, Aggregates]:
        query: dict[str, Any] = {"measures": names_param(measures), **window_params(window)}
        if histograms:
            query["histograms"] = names_param(histograms)
        grouping = group_by_param(group_by)
        if grouping is not None:
            query["group_by"] = grouping
        if params != DEFAULT_PARAMS:
            query["params"] = params_param(params)
        try:
            parts = [parse_aggregates(a["groups"])
                     for a in self._answers("/api/aggregate", query)]
        except (WireError, KeyError) as exc:
            raise RemoteError(f"/api/aggregate: {exc}") from exc
        return merge_groups(parts)

    def end_range(self, window: Window) -> tuple[float, float] | None:
        ranges = [a["end_range"] for a in self._answers("/api/aggregate/end_range",
                                                        window_params(window))
                  if a.get("end_range")]
        if not ranges:
            return None
        return min(float(r[0]) for r in ranges), max(float(r[1]) for r in ranges)

    def sample(self, window: Window, limit: int, fingerprinted: bool = False) -> Sample:
        query: dict[str, Any] = {"limit": limit, **window_params(window)}
        if fingerprinted:
            query["fingerprinted"] = "true"
        records: list[RequestRecord] = []
        of = 0
        for answer in self._answers("/api/sample", query):
            of += int(answer["of"])
            records.extend(RequestRecord.from_json(r) for r in answer["records"])
        records.sort(key=lambda r: r.end_unix)
        return Sample(records[-limit:] if len(records) > limit else records, of, limit)

    def records(self, limit: int | None = None, since_unix: float | None = None,
                until_unix: float | None = None) -> list[RequestRecord]:
        """The window's newest ``limit`` records (at most :data:`MAX_RECORDS`), newest
        first."""
        wanted = MAX_RECORDS if limit is None else min(limit, MAX_RECORDS)
        found = self.sample(Window(since_unix, until_unix), wanted)
        return found.records[::-1]

    def idle_cost_dollars(self, since_unix: float | None = None) -> float:
        return self._idle("idle_cost_dollars", since_unix)

    def idle_energy_joules(self, since_unix: float | None = None) -> float:
        return self._idle("idle_energy_joules", since_unix)

    def _idle(self, key: str, since_unix: float | None) -> float:
        query = {} if since_unix is None else {"since_unix": since_unix}
        return sum(float(a.get(key) or 0.0) for a in self._answers("/api/aggregate/idle", query))

    def coverage(self) -> Coverage:
        """The shortest retention and the oldest record of the stores."""
        parts = [parse_coverage(a["coverage"])
                 for a in self._answers("/api/aggregate/coverage", {})]
        retentions = [c.retention_seconds for c in parts if c.retention_seconds is not None]
        oldest = [c.oldest_end_unix for c in parts if c.oldest_end_unix is not None]
        return Coverage(min(retentions) if retentions else None,
                        min(oldest) if oldest else None)
