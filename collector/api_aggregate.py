"""``GET /api/aggregate`` and its siblings: the store's read interface (tokenpath/query.py)
over HTTP, so the CLI computes every view over one collector, N replicas or a shared
ClickHouse store the way it does over a store file (tokenpath/cli/remote.py), and no
record crosses the network to build one.

- ``/api/aggregate?measures=a,b&histograms=h&group_by=G&since_unix=&until_unix=&params=``:
  the measures (sums, minimums, maximums), log-bucket histograms and sets, by group;
- ``/api/aggregate/end_range``, ``/api/aggregate/idle`` (idle dollars and joules since),
  ``/api/aggregate/coverage``;
- ``/api/sample?limit=&fingerprinted=``: the window's newest records, at most ``limit``
  (:data:`MAX_SAMPLE`), for the views that need records (leaks by prefix, what-if).

Windows are absolute (unix seconds); every answer names its store (``store``). Wire
formats: tokenpath/query_wire.py.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, HTTPException, Query

from tokenpath.collector.store.base import Store
from tokenpath.query import ALL_MEASURES, HISTOGRAMS, SETS, SLO_MEASURES, Window
from tokenpath.query_wire import (
    WireError,
    aggregates_json,
    coverage_json,
    parse_group_by,
    parse_names,
    parse_params,
)

MAX_SAMPLE = 50_000  # above the views' own caps (tokenpath/views.py *_SAMPLE_LIMIT)
KNOWN_MEASURES = frozenset((*ALL_MEASURES, *SETS, *SLO_MEASURES))
KNOWN_HISTOGRAMS = frozenset(HISTOGRAMS)


def _window(since_unix: float | None, until_unix: float | None) -> Window:
    for name, value in (("since_unix", since_unix), ("until_unix", until_unix)):
        if value is not None and not math.isfinite(value):
            raise HTTPException(400, f"{name}: must be a finite unix time, not {value!r}")
    return Window(since_unix, until_unix)


def register(app: FastAPI, store: Store) -> None:
    """Adds the routes to ``app``; ``store`` answers them (any thread)."""

    @app.get("/api/aggregate")
    def aggregate(measures: str | None = None, histograms: str | None = None,
                  group_by: str | None = None, since_unix: float | None = None,
                  until_unix: float | None = None,
                  params: str | None = None) -> dict[str, Any]:
        window = _window(since_unix, until_unix)
        try:
            names = parse_names(measures, KNOWN_MEASURES, "measures")
            hists = parse_names(histograms, KNOWN_HISTOGRAMS, "histograms")
            groups = store.aggregate(window, names, hists, parse_group_by(group_by),
                                     parse_params(params))
        except WireError as exc:
            raise HTTPException(400, str(exc)) from exc
        return {"store": store.identity, "groups": aggregates_json(groups)}

    @app.get("/api/aggregate/end_range")
    def end_range(since_unix: float | None = None,
                  until_unix: float | None = None) -> dict[str, Any]:
        found = store.end_range(_window(since_unix, until_unix))
        return {"store": store.identity, "end_range": None if found is None else list(found)}

    @app.get("/api/aggregate/idle")
    def idle(since_unix: float | None = None) -> dict[str, Any]:
        _window(since_unix, None)
        return {"store": store.identity,
                "idle_cost_dollars": store.idle_cost_dollars(since_unix),
                "idle_energy_joules": store.idle_energy_joules(since_unix)}

    @app.get("/api/aggregate/coverage")
    def coverage() -> dict[str, Any]:
        return {"store": store.identity, "coverage": coverage_json(store.coverage())}

    @app.get("/api/sample")
    def sample(limit: int = Query(..., ge=1, le=MAX_SAMPLE), fingerprinted: bool = False,
               since_unix: float | None = None,
               until_unix: float | None = None) -> dict[str, Any]:
        found = store.sample(_window(since_unix, until_unix), limit, fingerprinted)
        return {"store": store.identity, "of": found.of, "limit": found.limit,
                "records": [r.to_json() for r in found.records]}
