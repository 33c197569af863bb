"""The stores' measures, written once: tokenpath.query's measures as SQL aggregates over
the ``records`` columns (collector/store/layout.py), in the dialect of the SQLite store
(collector/store/sqlite_sql.py) or of the ClickHouse store (collector/store/clickhouse_sql.py),
and what both stores' rollups share: which measures a rollup holds, each one's column,
and how a window splits into the periods read from the rollups and the rest read from
``records``.

**Measures.** Each measure name (tokenpath/query.py) has one SQL aggregate over a
``records`` row here; a view asks for the measures it needs and gets one row per group
back: only aggregates cross into Python.

**Rollups.** ``rollup`` holds every unparameterized measure (:data:`ROLLUP_MEASURES`)
per period (ROLLUP_SECONDS of end time); ``rollup_by`` the chargeback measures, the SLO
classes' measures and the long-context roofline terms (:data:`GROUP_MEASURES`) per period,
tenant, model, pool and SLO class; ``rollup_gpus`` the engines seen with their GPUs;
``rollup_hist`` each histogram's bucket counts per period; ``rollup_units`` the pricing
units seen without a GPU inventory. How each store fills them is its own (the SQLite
writer in runs, ClickHouse's materialized views as it inserts); :func:`plan` says, for
one aggregate, what comes from them and what from ``records``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import tokenpath.collector.store.layout as L
from tokenpath.leaks import CONTEXT_BUCKET_BOUNDS
from tokenpath.query import (
    ALL_MEASURES,
    CAUSE_VALUES,
    CONTEXT_BUCKETS,
    DEFAULT_PARAMS,
    HISTOGRAMS,
    LOG_GAMMA,
    NEGATIVE_BASE,
    SETS,
    SLO_GROUP,
    SLO_MEASURES,
    STAGE_VALUES,
    ZERO_KEY,
    GroupBy,
    Params,
    Window,
)
from tokenpath.slo import MISS_STAGES, OUTCOMES
from tokenpath.wire_sizes import DEFAULT_MSS_BYTES

ROLLUP_SECONDS = 600  # one rollup row per 10 minutes of end time (and group)
# What a view may group by besides time: the names ``rollup_by`` is kept by.
NAME_GROUPS = ("tenant", "model", "pool", SLO_GROUP)
GROUPS = NAME_GROUPS
# ClickHouse's period of an end time past this is this one's (toInt64 of a float past
# the Int64 range gives nonsense): year 31 million
_CLICKHOUSE_END_CAP = "1e15"

def _name_id(text: str) -> str:
    return f"coalesce((SELECT id FROM names WHERE text = '{text}'), -1)"


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass(frozen=True, slots=True)
class Dialect:
    """Where a store's SQL differs: SQLite (names coded as ids, ``total``, the scalar
    two-argument ``max``/``min``, integer ``/``) or ClickHouse (names as text,
    ``greatest``/``least``, ``intDiv``). The measures are written once, against this."""

    name: str

    @property
    def clickhouse(self) -> bool:
        return self.name == "clickhouse"

    def greatest(self, *args: str) -> str:
        return f"{'greatest' if self.clickhouse else 'max'}({', '.join(args)})"

    def least(self, *args: str) -> str:
        return f"{'least' if self.clickhouse else 'min'}({', '.join(args)})"

    def total(self, expr: str) -> str:
        """The sum of the non-NULL values as a float; 0.0 over none."""
        return f"coalesce(sum(toFloat64({expr})), 0.0)" if self.clickhouse else f"total({expr})"

    def idiv(self, expr: str, by: str) -> str:
        return f"intDiv({expr}, {by})" if self.clickhouse else f"{expr} / {by}"

    def name_value(self, text: str) -> str:
        """A name as the records' name columns hold it (an id in SQLite, text here)."""
        return _quote(text) if self.clickhouse else _name_id(text)

    def context(self) -> str:
        return (f"({self.greatest('0', 'input_tokens')} + {self.greatest('0', 'output_tokens')})"
                if self.clickhouse else L.CONTEXT_SQL)

    def period(self) -> str:
        """A record's rollup period: its end time's ROLLUP_SECONDS since the epoch (rolled
        up where ``end_unix >= 0``), the same expression wherever a query splits a
        window, so a record is read from the rollups or from ``records``, never both."""
        if self.clickhouse:
            return f"toInt64(least(end_unix, {_CLICKHOUSE_END_CAP}) / {ROLLUP_SECONDS})"
        return f"CAST(end_unix / {ROLLUP_SECONDS} AS INTEGER)"


SQLITE = Dialect("sqlite")
CLICKHOUSE = Dialect("clickhouse")


def derived_sql(d: Dialect) -> dict[str, str]:
    """Per-row values several measures use, computed once a row in the subquery every
    measure reads from (:func:`source_sql`; in SQLite LIMIT keeps it from inlining them
    back into each measure)."""
    context = d.context()
    cached = d.greatest("0", d.least("cache_read_tokens", "input_tokens - 1"))
    new = d.greatest("1", f"input_tokens - {cached}")
    return {
        "d_ctx": context,
        "d_cb": "(CASE " + " ".join(f"WHEN {context} < {bound} THEN {i}"
                                    for i, bound in enumerate(CONTEXT_BUCKET_BOUNDS))
                + f" ELSE {len(CONTEXT_BUCKET_BOUNDS)} END)",
        "d_cached": cached,
        "d_new": new,
        "d_q": f"({new} * {cached} + {new} * ({new} + 1) / 2.0)",
        "d_pfd": "(" + " + ".join(f"coalesce({L.phase_column(s, 'prefill', 'c')}, 0.0)"
                                  for s in STAGE_VALUES) + ")",
        "d_stream": "(response_chunks > 1 AND output_tokens > 0)",
        "d_pk": ("(CASE WHEN response_packets != 0 THEN response_packets "
                 "ELSE response_chunks END)"),
    }


_CONTEXT_SQL = L.CONTEXT_SQL
DERIVED: dict[str, str] = derived_sql(SQLITE)
_CTX, _BUCKET, _CACHED, _NEW, _Q = "d_ctx", "d_cb", "d_cached", "d_new", "d_q"
_PREFILL_DOLLARS, _STREAM, _PACKETS = "d_pfd", "d_stream", "d_pk"


def source_sql(where: str, uses: str = "", table: str = "records",
               d: Dialect = SQLITE) -> str:
    """The rows measures read: ``records`` rows matching ``where``, with the values of
    :data:`DERIVED` that ``uses`` (the measures' SQL) names."""
    derived = "".join(f", {expr} AS {name}" for name, expr in derived_sql(d).items()
                      if re.search(rf"\b{name}\b", uses))
    if not derived:
        return f"{table} WHERE {where}"
    limit = "" if d.clickhouse else " LIMIT -1"
    return f"(SELECT *{derived} FROM {table} WHERE {where}{limit})"


def _ceil_div(expr: str, by: int, d: Dialect = SQLITE) -> str:
    return (f"(CASE WHEN {expr} >= 0 THEN {d.idiv(f'({expr} + {by - 1})', str(by))} "
            f"ELSE -({d.idiv(f'(-{expr})', str(by))}) END)")


def bucket_key_sql(value: str, d: Dialect = SQLITE) -> str:
    """tokenpath.query.bucket_key in SQL (in SQLite the same libm ``log``, so the same
    bucket; ClickHouse's ``log`` may differ in the last bit at a bucket's edge, which moves
    a value to the next bucket: still within the quantiles' bound)."""
    lg = repr(LOG_GAMMA)
    if d.clickhouse:  # toInt64 of a NaN fails even in a branch not taken: log of |v| > 0
        safe = f"greatest(abs({value}), 1e-300)"
        return (f"(CASE WHEN {value} > 0 THEN toInt64(ceil(log({safe}) / {lg})) "
                f"WHEN {value} < 0 THEN {NEGATIVE_BASE} - toInt64(ceil(log({safe}) / {lg})) "
                f"ELSE {ZERO_KEY} END)")
    return (f"(CASE WHEN {value} > 0 THEN CAST(ceil(ln({value}) / {lg}) AS INTEGER) "
            f"WHEN {value} < 0 THEN {NEGATIVE_BASE} - CAST(ceil(ln(-({value})) / {lg}) AS INTEGER) "
            f"ELSE {ZERO_KEY} END)")


def _coalesced(tokens_per_write: int, d: Dialect = SQLITE) -> str:
    token_writes = d.least("response_chunks", "output_tokens")
    writes = (f"({_ceil_div(token_writes, tokens_per_write, d)} + response_chunks - "
              f"{token_writes})")
    return (f"(CASE WHEN {_STREAM} THEN "
            f"{d.greatest(writes, _ceil_div('response_bytes', DEFAULT_MSS_BYTES, d), '1')} END)")


def _last_doubling(params: Params, args: list[Any], d: Dialect = SQLITE) -> str:
    """Each long-context record's prefill dollars times the share of its prefill FLOPs
    that halving its prompt removes (collector/cost/longcontext.py), by its model's
    constants; half its prefill dollars for a model without them."""
    dollars = _PREFILL_DOLLARS
    half_new = d.greatest("1", d.idiv(_NEW, "2"))
    half_cached = f"({d.idiv(_CACHED, '2')})"
    half_q = f"({half_new} * {half_cached} + {half_new} * ({half_new} + 1) / 2.0)"
    whens = []
    for model, p2, a in params.model_constants:
        full = f"({p2!r} * {_NEW} + {a!r} * {_Q})"
        half = f"({p2!r} * {half_new} + {a!r} * {half_q})"
        if d.clickhouse:
            model_value = _quote(model)
        else:
            model_value = "(SELECT id FROM names WHERE text = ?)"
            args.append(model)
        whens.append(f"WHEN {model_value} THEN "
                     f"(CASE WHEN {full} > 0 THEN {dollars} * (1.0 - {half} / {full}) "
                     "ELSE 0.0 END)")
    by_model = (f"CASE model {' '.join(whens)} ELSE {dollars} / 2.0 END" if whens
                else f"{dollars} / 2.0")
    return d.total(f"CASE WHEN {_CTX} >= {int(params.long_context_tokens)} AND {dollars} > 0 "
                   f"THEN {by_model} END")


def measure_sql(name: str, params: Params = DEFAULT_PARAMS,
                args: list[Any] | None = None, d: Dialect = SQLITE) -> str:
    """The SQL aggregate of measure ``name`` over ``records`` rows. ``args`` receives
    the parameters the expression binds, in order (none in ClickHouse: values inline)."""
    if name == "last_doubling":
        return _last_doubling(params, [] if args is None else args, d)
    parts = name.split(":")
    kind = parts[0]
    total = d.total
    measured, empty = d.name_value("measured"), d.name_value("")
    simple: dict[str, str] = {
        "n": "count(*)",
        "complete_n": "coalesce(sum(complete), 0)",
        "simulated_n": "coalesce(sum(simulated), 0)",
        "fingerprinted_n": ("countIf(notEmpty(prefix_fingerprints))" if d.clickhouse
                            else "count(prefix_fingerprints)"),
        "priced_n": "coalesce(sum(cost_dollars > 0 OR naive_cost_dollars > 0), 0)",
        "input_tokens": "coalesce(sum(input_tokens), 0)",
        "cache_read_tokens": "coalesce(sum(cache_read_tokens), 0)",
        "output_tokens": "coalesce(sum(output_tokens), 0)",
        "input_tokens_pos": f"coalesce(sum({d.greatest('0', 'input_tokens')}), 0)",
        "output_tokens_pos": f"coalesce(sum({d.greatest('0', 'output_tokens')}), 0)",
        "cost": total("cost_dollars"),
        "naive_cost": total("naive_cost_dollars"),
        "waste": total("cache_miss_waste_dollars"),
        "energy": total("energy_joules"),
        "energy_pos": total(d.greatest("0.0", "energy_joules")),
        "energy_measured_n": f"coalesce(sum(energy_provenance = {measured}), 0)",
        "energy_other_n": (f"coalesce(sum(energy_provenance IS NOT NULL AND energy_provenance "
                           f"NOT IN ({measured}, {empty})), 0)"),
        "prefill_seconds": total("prefill_seconds"),
        "decode_seconds": total("decode_seconds"),
        "response_chunks": "coalesce(sum(response_chunks), 0)",
        "small_chunks": "coalesce(sum(small_chunks), 0)",
        "response_bytes": "coalesce(sum(response_bytes), 0)",
        "min_start": "min(start_unix)",
        "max_end": "max(end_unix)",
        "prefill_cost": total(_PREFILL_DOLLARS),
        "lm_streams": f"coalesce(sum({_STREAM}), 0)",
        "lm_tokens": f"coalesce(sum(CASE WHEN {_STREAM} THEN output_tokens END), 0)",
        "lm_bytes": f"coalesce(sum(CASE WHEN {_STREAM} THEN response_bytes END), 0)",
        "lm_packets": f"coalesce(sum(CASE WHEN {_STREAM} THEN {_PACKETS} END), 0)",
        "lm_resp_s": total(f"CASE WHEN {_STREAM} THEN s_response_path END"),
        "lm_resp_c": total(f"CASE WHEN {_STREAM} THEN c_response_path END"),
        "lm_tpot_sum": total(f"CASE WHEN {_STREAM} THEN tpot_seconds END"),
        "lm_tpot_n": f"coalesce(sum({_STREAM} AND tpot_seconds IS NOT NULL), 0)",
        "lm_est_n": f"coalesce(sum({_STREAM} AND response_packets = 0), 0)",
    }
    if name in simple:
        return simple[name]
    threshold = int(params.long_context_tokens)
    long_ = f"{_CTX} >= {threshold}"
    if name == "lc_n":
        return f"coalesce(sum({long_}), 0)"
    if name == "lc_cost":
        return total(f"CASE WHEN {long_} THEN cost_dollars END")
    if name == "lc_prefill_s":
        return total(f"CASE WHEN {long_} THEN prefill_seconds END")
    if name == "lc_prefill_c":
        return total(f"CASE WHEN {long_} THEN {_PREFILL_DOLLARS} END")
    if name == "lm_leaking":
        ratio = repr(float(params.packets_per_token_threshold))
        return (f"coalesce(sum({_STREAM} AND {_PACKETS} * 1.0 / output_tokens >= {ratio}), 0)")
    if kind in ("st_n", "st_s", "st_c", "max_prov") and parts[1] in STAGE_VALUES:
        stage = parts[1]
        return {"st_n": f"count(p_{stage})",
                "st_s": total(f"s_{stage}"), "st_c": total(f"c_{stage}"),
                "max_prov": f"max(p_{stage})"}[kind]
    if kind in ("ph_s", "ph_c") and len(parts) == 3:  # NULL: no record has the share
        return f"sum({L.phase_column(parts[1], parts[2], kind[-1])})"
    if kind in ("mt", "md") and parts[1] in CAUSE_VALUES:
        column = f"{kind}_{parts[1]}"
        return f"coalesce(sum({column}), 0)" if kind == "mt" else total(column)
    if kind in ("slo_n", "slo_c") and parts[1] in OUTCOMES:
        is_outcome = f"slo_outcome = {d.name_value(parts[1])}"
        return (f"coalesce(sum({is_outcome}), 0)" if kind == "slo_n"
                else total(f"CASE WHEN {is_outcome} THEN cost_dollars END"))
    if kind in ("slo_ms", "slo_mc") and parts[1] in MISS_STAGES:
        is_stage = f"slo_miss_stage = {d.name_value(parts[1])}"
        return (f"coalesce(sum({is_stage}), 0)" if kind == "slo_ms"
                else total(f"CASE WHEN {is_stage} THEN cost_dollars END"))
    if kind.startswith("cb_") and len(parts) == 2:
        i = int(parts[1])
        in_bucket = f"{_BUCKET} = {i}"
        return {"cb_n": f"coalesce(sum({in_bucket}), 0)",
                "cb_cost": total(f"CASE WHEN {in_bucket} THEN cost_dollars END"),
                "cb_prefill_s": total(f"CASE WHEN {in_bucket} THEN prefill_seconds END"),
                "cb_new": f"coalesce(sum(CASE WHEN {in_bucket} THEN {_NEW} END), 0)",
                "cb_q": total(f"CASE WHEN {in_bucket} THEN {_Q} END")}[kind]
    if kind == "lm_coal" and int(parts[1]) > 0:
        return f"coalesce(sum({_coalesced(int(parts[1]), d)}), 0)"
    raise ValueError(f"unknown measure {name!r}")


def histogram_value_sql(name: str) -> tuple[str, str]:
    """(value, condition) of histogram ``name`` on a ``records`` row."""
    if name == "ttft":
        return "ttft_seconds", "ttft_seconds IS NOT NULL"
    if name == "tpot":
        return "tpot_seconds", "tpot_seconds IS NOT NULL"
    stage = name.split(":", 1)[1]
    if not name.startswith("stage:") or stage not in STAGE_VALUES:
        raise ValueError(f"unknown histogram {name!r}")
    return f"s_{stage}", f"p_{stage} IS NOT NULL"


# --- what the rollups hold -----------------------------------------------------------------

# ``rollup``: every unparameterized measure, per period. ``rollup_by``: the measures grouped
# views ask for (chargeback; the long-context roofline terms by model), per period, tenant,
# model and pool.
ROLLUP_MEASURES = tuple(m for m in ALL_MEASURES if m != "last_doubling")
GROUP_MEASURES = ("n", "input_tokens_pos", "output_tokens_pos", "cost", "energy_pos",
                  "energy_measured_n", "energy_other_n", *SLO_MEASURES,
                  *(f"{kind}:{i}" for i in range(CONTEXT_BUCKETS) for kind in ("cb_new", "cb_q")))
ROLLUP_SET = frozenset(ROLLUP_MEASURES)
GROUP_SET = frozenset(GROUP_MEASURES)
HISTOGRAM_INDEX = {name: i for i, name in enumerate(HISTOGRAMS)}


def rollup_column(measure: str) -> str:
    return "m_" + measure.replace(":", "__")


def rollup_function(measure: str) -> str:
    """How a measure's rollup values combine: ``sum``, or ``min``/``max`` (its prefix)."""
    return measure[:3] if measure.startswith(("min_", "max_")) else "sum"


def is_float(measure: str) -> bool:
    sql = measure_sql(measure)
    return (sql.startswith("total(") or measure in ("min_start", "max_end")
            or measure.startswith(("ph_s:", "ph_c:")))


def nullable_sum(measure: str) -> bool:
    """A sum that is NULL over records none of which has the value (a phase's share)."""
    return measure.startswith(("ph_s:", "ph_c:"))


def held(sums: Sequence[str], histograms: Sequence[str], sets: Sequence[str],
         group_by: GroupBy, params: Params) -> set[str]:
    """The measures, histograms and sets the rollups hold for this grouping and these
    parameters (a parameterized measure only at its default)."""
    if group_by is None:
        out = {m for m in sums if m in ROLLUP_SET}
        out.update(histograms)
        out.update(m for m in sets if m in SETS)
    elif group_by in NAME_GROUPS:
        out = {m for m in sums if m in GROUP_SET}
        out.update(m for m in sets if m == "set:models")
    else:
        return set()
    if params.long_context_tokens != DEFAULT_PARAMS.long_context_tokens:
        out = {m for m in out if not m.startswith("lc_")}
    if params.packets_per_token_threshold != DEFAULT_PARAMS.packets_per_token_threshold:
        out.discard("lm_leaking")
    return out


# --- windows ----------------------------------------------------------------------------------

Where = tuple[str, list[Any]]  # a condition on records rows and its arguments (``?``)


def window_where(window: Window) -> Where:
    conditions, args = [], []
    if window.since_unix is not None:
        conditions.append("end_unix >= ?")
        args.append(window.since_unix)
    if window.until_unix is not None:
        conditions.append("end_unix <= ?")
        args.append(window.until_unix)
    return " AND ".join(conditions) or "1", args


def split_window(window: Window, rollup_from: int | None, rolled_rid: int | None = 0,
                 d: Dialect = SQLITE) -> tuple[tuple[int, int | None] | None, list[Where]]:
    """The rollup periods ``[first, last)`` the window covers whole (None: none; last None:
    to the newest), and the conditions that select the rest of it from ``records``: the
    partial first and last periods, and (SQLite) the records of the whole periods the
    rollups do not hold yet (past the watermark ``rolled_rid``; None: the rollups hold
    every record, as ClickHouse's materialized views do). A record's period is the
    rollups' own expression, so the parts never overlap."""
    since, until = window.since_unix, window.until_unix
    if rollup_from is None:
        return None, [window_where(window)]
    period = d.period()
    first = 0 if since is None or since <= 0 else math.ceil(since / ROLLUP_SECONDS)
    first = max(first, rollup_from)
    last = None if until is None else math.floor(until / ROLLUP_SECONDS)
    if last is not None and last <= first:
        return None, [window_where(window)]
    parts: list[Where] = []
    head, head_args = window_where(Window(since, None))
    # the index bounds the scan (a second past the period's start), the period decides
    parts.append((f"{head} AND end_unix < ? AND ({period} < ? OR end_unix < 0)",
                  [*head_args, first * ROLLUP_SECONDS + 1.0, first]))
    if last is not None:
        tail, tail_args = window_where(Window(None, until))
        parts.append((f"end_unix >= ? AND end_unix >= 0 AND {period} >= ? AND {tail}",
                       [last * ROLLUP_SECONDS - 1.0, last, *tail_args]))
    if rolled_rid is not None:
        newest = "" if last is None else f" AND {period} < ?"
        parts.append((f"rid > ? AND end_unix >= 0 AND {period} >= ?{newest}",
                       [rolled_rid, first, *([] if last is None else [last])]))
    return (first, last), parts


Asked = tuple[list[str], list[str], list[str]]  # (sums, histograms, sets)


@dataclass(frozen=True, slots=True)
class Plan:
    """Where one aggregate's parts come from: ``rolled`` from the rollups' ``periods``
    plus ``records`` under each of ``edges``; ``rest`` from ``records`` over the window."""

    rolled: Asked
    periods: tuple[int, int | None] | None
    edges: list[Where]
    rest: Asked


def plan(window: Window, measures: Sequence[str], histograms: Sequence[str],
         group_by: GroupBy, params: Params, rollup_from: int | None,
         rolled_rid: int | None = 0, d: Dialect = SQLITE) -> Plan:
    """What of an aggregate the rollups give (those of :func:`held`, over the periods of
    :func:`split_window`) and what ``records`` alone: everything when the rollups are
    unusable (``rollup_from`` None) or the window covers no whole period."""
    sums = [m for m in measures if not m.startswith("set:")]
    sets = [m for m in measures if m.startswith("set:")]
    kept = set() if rollup_from is None else held(sums, histograms, sets, group_by, params)
    periods, edges = split_window(window, rollup_from, rolled_rid, d) if kept else (None, [])
    if periods is None:
        return Plan(([], [], []), None, [], (sums, list(histograms), sets))
    return Plan(([m for m in sums if m in kept], [h for h in histograms if h in kept],
                 [m for m in sets if m in kept]), periods, edges,
                ([m for m in sums if m not in kept], [h for h in histograms if h not in kept],
                 [m for m in sets if m not in kept]))
