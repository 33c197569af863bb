"""The read interface (:mod:`tokenpath.query`) on the wire: what a collector's
``GET /api/aggregate`` family answers and the remote reader (tokenpath/cli/remote.py)
reads back, so every view is computed the same way over N collectors as over one store.

Everything sent is mergeable: measures (sums, minimums, maximums), log-bucket histograms
(counts per bucket) and sets, grouped; a window has absolute ends (unix seconds), never a
duration read on the answering collector's clock. Each answer names the store it came
from (``store``), so collectors sharing one store (ClickHouse) are counted once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from tokenpath.query import (
    DEFAULT_PARAMS,
    SLO_GROUP,
    Aggregates,
    Coverage,
    GroupBy,
    Params,
    TimeBuckets,
    Window,
)

GROUP_NAMES = frozenset({"tenant", "model", "pool", SLO_GROUP})
TIME_PREFIX = "time:"


class WireError(ValueError):
    """A query parameter or an answer that does not parse; the message names it."""


def group_by_param(group_by: GroupBy) -> str | None:
    """``group_by`` as the query parameter's value (None: no grouping)."""
    if isinstance(group_by, TimeBuckets):
        return f"{TIME_PREFIX}{group_by.start_unix!r}:{group_by.width!r}:{group_by.count}"
    return group_by


def parse_group_by(value: str | None) -> GroupBy:
    if value is None or value == "":
        return None
    if value in GROUP_NAMES:
        return value
    if value.startswith(TIME_PREFIX):
        try:
            start, width, count = value.removeprefix(TIME_PREFIX).split(":")
            buckets = TimeBuckets(float(start), float(width), int(count))
        except ValueError as exc:
            raise WireError(f"group_by: {value!r} is not time:START:WIDTH:COUNT") from exc
        if not (math.isfinite(buckets.start_unix) and buckets.width > 0
                and 1 <= buckets.count <= MAX_TIME_BUCKETS):
            raise WireError(f"group_by: {value!r}: a finite start, a width > 0 and 1 to "
                            f"{MAX_TIME_BUCKETS} buckets")
        return buckets
    raise WireError(f"group_by: {value!r}; one of {', '.join(sorted(GROUP_NAMES))} or "
                    "time:START:WIDTH:COUNT")


MAX_TIME_BUCKETS = 10_000


def params_param(params: Params) -> str:
    return json.dumps({"long_context_tokens": params.long_context_tokens,
                       "packets_per_token_threshold": params.packets_per_token_threshold,
                       "model_constants": [list(c) for c in params.model_constants]},
                      separators=(",", ":"))


def parse_params(value: str | None) -> Params:
    if not value:
        return DEFAULT_PARAMS
    try:
        data = json.loads(value)
        constants = tuple((str(m), float(a), float(b))
                          for m, a, b in data.get("model_constants", ()))
        params = Params(int(data.get("long_context_tokens",
                                     DEFAULT_PARAMS.long_context_tokens)),
                        float(data.get("packets_per_token_threshold",
                                       DEFAULT_PARAMS.packets_per_token_threshold)),
                        constants)
    except (ValueError, TypeError, AttributeError) as exc:
        raise WireError(f"params: not a JSON object of the query parameters: {exc}") from exc
    if params.long_context_tokens < 1 or not params.packets_per_token_threshold > 0:
        raise WireError("params: long_context_tokens must be >= 1 and "
                        "packets_per_token_threshold > 0")
    return params


def names_param(names: Sequence[str]) -> str:
    return ",".join(names)


def parse_names(value: str | None, known: frozenset[str], key: str) -> list[str]:
    names = [n for n in (value or "").split(",") if n]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise WireError(f"{key}: unknown {', '.join(unknown[:5])}")
    return names


def window_params(window: Window) -> dict[str, float]:
    out: dict[str, float] = {}
    if window.since_unix is not None:
        out["since_unix"] = window.since_unix
    if window.until_unix is not None:
        out["until_unix"] = window.until_unix
    return out


def histogram_json(hist: Mapping[int, int]) -> list[int]:
    """A log-bucket histogram as its first bucket's index, then each bucket's count in
    order, where ``-n`` stands for ``n`` empty buckets (the offset and bucket counts of an
    OTLP exponential histogram, its empty runs folded): what a histogram weighs grows with
    the buckets it spans, not with the records it counts."""
    keys = sorted(k for k, c in hist.items() if c)
    if not keys:
        return []
    out = [keys[0]]
    previous = keys[0] - 1
    for key in keys:
        if key - previous > 1:
            out.append(previous + 1 - key)
        out.append(hist[key])
        previous = key
    return out


def parse_histogram(data: Sequence[Any]) -> dict[int, int]:
    """:func:`histogram_json` read back (linear in its length)."""
    if not data:
        return {}
    out: dict[int, int] = {}
    key = int(data[0])
    for item in data[1:]:
        value = int(item)
        if value < 0:
            key -= value
        elif value > 0:
            out[key] = value
            key += 1
        else:
            raise ValueError("a histogram's bucket counts are > 0, its gaps < 0")
    return out


def aggregates_json(groups: Mapping[Any, Aggregates]) -> list[list[Any]]:
    """``[[group key, {values, histograms, sets}], ...]`` (histograms as
    :func:`histogram_json` writes them)."""
    return [[key, {"values": agg.values,
                   "histograms": {name: histogram_json(hist)
                                  for name, hist in agg.histograms.items()},
                   "sets": {name: sorted(items) for name, items in agg.sets.items()}}]
            for key, agg in groups.items()]


def parse_aggregates(data: Any) -> dict[Any, Aggregates]:
    try:
        out: dict[Any, Aggregates] = {}
        for key, body in data:
            out[key] = Aggregates(
                {str(n): float(v) for n, v in body["values"].items()},
                {str(n): parse_histogram(buckets)
                 for n, buckets in body["histograms"].items()},
                {str(n): {str(i) for i in items} for n, items in body["sets"].items()})
        return out
    except (TypeError, ValueError, KeyError) as exc:
        raise WireError(f"an aggregate answer that does not parse: {exc}") from exc


def coverage_json(coverage: Coverage) -> dict[str, Any]:
    return {"retention_seconds": coverage.retention_seconds,
            "oldest_end_unix": coverage.oldest_end_unix, "now_unix": coverage.now_unix}


def parse_coverage(data: Mapping[str, Any]) -> Coverage:
    def number(name: str) -> float | None:
        value = data.get(name)
        return None if value is None else float(value)

    return Coverage(number("retention_seconds"), number("oldest_end_unix"),
                    number("now_unix"))
