"""The ClickHouse store's rollups: the same five rollups as the SQLite store's
(collector/store/measures.py says what each holds), kept by ClickHouse itself.

**Tables.** ``rollup`` (per period) and ``rollup_by`` (per period, tenant, model, pool,
SLO class)
are AggregatingMergeTrees with a ``SimpleAggregateFunction(sum|min|max, ...)`` column per
measure; ``rollup_hist`` a SummingMergeTree of counts keyed (period, histogram, bucket);
``rollup_units`` a ReplacingMergeTree keyed (period, node, engine_id), ``rollup_gpus`` one
keyed (period, node, engine_id, tensor_parallel). A period is
ROLLUP_SECONDS of end time. A materialized view on ``records`` feeds each, so every insert
into ``records`` (the writer's batches, an ``INSERT ... SELECT``) adds its rows' aggregates
as it commits, a late record's to its own period: there is no watermark. Merges combine
rows of the same key in the background; a query sums (or takes the min or max of) the
rows of each key itself, so it never needs ``FINAL``.

**Retried inserts.** A batch sent again with the same ``insert_deduplication_token`` is
dropped by ``records`` and, with ``deduplicate_blocks_in_dependent_materialized_views``
(set on every insert), by each rollup too: the views' own inserts carry tokens derived
from the batch's, and the rollups keep the last DEDUPLICATION_WINDOW like ``records``.
Without the setting a retried batch would be dropped by ``records`` but added to the
rollups again.

**Retention.** The rollups have the records' TTL, counted from the end of each period
(a period's row goes when its newest record may), and a query reads only the periods
whose every record is within the retention from them (:func:`first_kept_period`), the
older ones from ``records``, as the TTL leaves them.

**Existing stores.** The tables and views are created at start with the rest of the
schema. A store created without them (or whose rollups another version defined: ``meta``
keeps a signature of their SQL) gets them rebuilt at start: the views created, then
filled from ``records`` with ``INSERT ... SELECT`` (logged; as long as one report over
every record). That start must be the only writer of the store meanwhile (a collector
opening its own store is: it writes after; on a shared server, start one collector of
the new version before the others). A fresh store is only created, never rebuilt, so
collectors starting together on one server do not undo each other's tables.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import tokenpath.collector.store.layout as L
import tokenpath.collector.store.measures as S
from tokenpath.collector.store.clickhouse_client import Connection
from tokenpath.identity import pricing_unit
from tokenpath.leaks import LONG_CONTEXT_TOKENS
from tokenpath.query import DEFAULT_PARAMS, HISTOGRAMS, STAGE_VALUES, Aggregates, GroupBy
from tokenpath.slo import unit_gpus_item

log = logging.getLogger(__name__)

ROLLUP_TABLES = ("rollup", "rollup_by", "rollup_hist", "rollup_units", "rollup_gpus",
                 "records_long")
# records_long: the columns the last doubling's prefill dollars (a measure of each model's
# roofline constants, which no rollup can hold) reads, of the long-context records only.
LONG_COLUMNS = ("end_unix", "model", "input_tokens", "output_tokens", "cache_read_tokens",
                *(L.phase_column(s, "prefill", "c") for s in STAGE_VALUES))
LONG_WHERE = f"{S.CLICKHOUSE.context()} >= {LONG_CONTEXT_TOKENS}"
DEDUPLICATION_WINDOW = 1000  # inserts whose tokens a table remembers (a retried batch)
# Settings every insert into ``records`` carries: a retried batch is dropped by the
# rollups' views too (ClickHouse before 25.x does not by default).
INSERT_SETTINGS: dict[str, Any] = {"deduplicate_blocks_in_dependent_materialized_views": 1}
_D = S.CLICKHOUSE
_PERIOD = _D.period()
_ROLLED = "end_unix >= 0"  # the records the rollups hold (the others are read from records)
# Start the rollups' periods this long after the retention's edge: TTL deletes by the
# server's clock, which may be ahead of this one's.
_CLOCK_MARGIN_SECONDS = 3600.0


def ttl(retention_seconds: float, seconds_expr: str) -> str:
    """A TTL deleting the rows whose ``seconds_expr`` (unix seconds) is past the
    retention."""
    return (f"TTL toDateTime({seconds_expr}) + "
            f"toIntervalSecond({max(1, math.ceil(retention_seconds))})")


ROLLUP_TTL_SECONDS = f"greatest((period + 1) * {S.ROLLUP_SECONDS}, 0)"
RECORDS_TTL_SECONDS = "greatest(end_unix, 0)"


def ttl_seconds(table: str) -> str:
    """The time a row of ``table`` (a rollup or the records) is kept from."""
    return ROLLUP_TTL_SECONDS if table.startswith("rollup") else RECORDS_TTL_SECONDS


def _column_type(measure: str) -> str:
    kind = "Float64" if S.is_float(measure) else "Int64"
    if S.nullable_sum(measure) or measure.startswith("max_prov:"):
        kind = f"Nullable({kind})"
    return f"SimpleAggregateFunction({S.rollup_function(measure)}, {kind})"


def _select_measures(measures: Sequence[str]) -> str:
    return ", ".join(f"{S.measure_sql(m, DEFAULT_PARAMS, None, _D)} AS {S.rollup_column(m)}"
                     for m in measures)


def _grouped_select(measures: Sequence[str], keys: Sequence[str]) -> str:
    """The measures per period (and ``keys``) of the ``records`` rows rolled up."""
    select = _select_measures(measures)
    key_sql = "".join(f", {k}" for k in keys)
    return (f"SELECT {_PERIOD} AS period{key_sql}, {select} "
            f"FROM {S.source_sql(_ROLLED, select, 'records', _D)} "
            f"GROUP BY period{key_sql}")


def histogram_rows_sql(histograms: Sequence[str], where: str, group: str | None = None,
                       alias: str = "grp") -> str:
    """One pass over the ``records`` rows matching ``where``: per (``group`` as
    ``alias``, histogram index of HISTOGRAM_INDEX, bucket) the count of rows whose value
    of that histogram falls in the bucket."""
    pairs = ", ".join(
        f"tuple(toUInt8({S.HISTOGRAM_INDEX[h]}), CASE WHEN {S.histogram_value_sql(h)[1]} "
        f"THEN {S.bucket_key_sql(S.histogram_value_sql(h)[0], _D)} END)" for h in histograms)
    key, by = ("", "") if group is None else (f"{group} AS {alias}, ", f"{alias}, ")
    return (f"SELECT {key}h.1 AS histogram, assumeNotNull(h.2) AS bucket, count() AS n "
            f"FROM records ARRAY JOIN arrayFilter(x -> isNotNull(x.2), [{pairs}]) AS h "
            f"WHERE {where} GROUP BY {by}histogram, bucket")


def _views() -> dict[str, str]:
    """Each rollup's view: the SELECT over ``records`` that feeds it."""
    return {
        "rollup": _grouped_select(S.ROLLUP_MEASURES, ()),
        "rollup_by": _grouped_select(S.GROUP_MEASURES, S.NAME_GROUPS),
        "rollup_hist": histogram_rows_sql(HISTOGRAMS, _ROLLED, _PERIOD, "period"),
        "rollup_units": (f"SELECT DISTINCT {_PERIOD} AS period, node, engine_id FROM records "
                         f"WHERE {_ROLLED} AND gpu_inventory = 0"),
        "rollup_gpus": (f"SELECT DISTINCT {_PERIOD} AS period, node, engine_id, "
                        f"tensor_parallel FROM records WHERE {_ROLLED}"),
        "records_long": f"SELECT {', '.join(LONG_COLUMNS)} FROM records WHERE {LONG_WHERE}",
    }


VIEWS = _views()


def _tables(types: Mapping[str, str], retention_seconds: float) -> dict[str, str]:
    def columns(measures: Sequence[str]) -> str:
        return ",\n    ".join(f"{S.rollup_column(m)} {_column_type(m)}" for m in measures)

    def names(*keys: str) -> str:
        return "".join(f"{k} {types[k]},\n    " for k in keys)

    settings = (f"SETTINGS non_replicated_deduplication_window = {DEDUPLICATION_WINDOW}, "
                "allow_nullable_key = 1")
    tail = (f"PARTITION BY intDiv(period, {86400 // S.ROLLUP_SECONDS})\n"
            f"{ttl(retention_seconds, ROLLUP_TTL_SECONDS)}\n{settings}")
    return {
        "rollup": f"""CREATE TABLE IF NOT EXISTS rollup (
    period Int64,
    {columns(S.ROLLUP_MEASURES)}
) ENGINE = AggregatingMergeTree ORDER BY period
{tail}""",
        "rollup_by": f"""CREATE TABLE IF NOT EXISTS rollup_by (
    period Int64,
    {names(*S.NAME_GROUPS)}{columns(S.GROUP_MEASURES)}
) ENGINE = AggregatingMergeTree ORDER BY (period, {', '.join(S.NAME_GROUPS)})
{tail}""",
        "rollup_hist": f"""CREATE TABLE IF NOT EXISTS rollup_hist (
    period Int64,
    histogram UInt8,
    bucket Int64,
    n UInt64
) ENGINE = SummingMergeTree(n) ORDER BY (period, histogram, bucket)
{tail}""",
        "rollup_units": f"""CREATE TABLE IF NOT EXISTS rollup_units (
    period Int64,
    {names('node', 'engine_id').rstrip().rstrip(',')}
) ENGINE = ReplacingMergeTree ORDER BY (period, node, engine_id)
{tail}""",
        "rollup_gpus": f"""CREATE TABLE IF NOT EXISTS rollup_gpus (
    period Int64,
    {names('node', 'engine_id', 'tensor_parallel').rstrip().rstrip(',')}
) ENGINE = ReplacingMergeTree ORDER BY (period, node, engine_id, tensor_parallel)
{tail}""",
        "records_long": f"""CREATE TABLE IF NOT EXISTS records_long (
    {names(*LONG_COLUMNS).rstrip().rstrip(',')}
) ENGINE = MergeTree PARTITION BY toDate(toDateTime(greatest(end_unix, 0))) ORDER BY end_unix
{ttl(retention_seconds, RECORDS_TTL_SECONDS)}
{settings}""",
    }


def signature(types: Mapping[str, str]) -> str:
    """What the rollups are: their tables (without the retention) and views."""
    text = "\n".join((*_tables(types, 1.0).values(), *VIEWS.values(), str(S.ROLLUP_SECONDS)))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def schema_statements(types: Mapping[str, str], retention_seconds: float) -> list[str]:
    """The rollups' tables, then their views (a view's table must exist first)."""
    return [*_tables(types, retention_seconds).values(),
            *(f"CREATE MATERIALIZED VIEW IF NOT EXISTS {table}_mv TO {table} AS {select}"
              for table, select in VIEWS.items())]


def ensure(conn: Connection, types: Mapping[str, str], retention_seconds: float,
           kept_signature: str | None) -> str:
    """Create the rollups (their views on ``records`` last); rebuild them from
    ``records`` when ``kept_signature`` (meta's) is not theirs and ``records`` holds rows
    they may lack. Returns the signature to keep.

    A fresh store (no rows) only gets ``CREATE ... IF NOT EXISTS``: several collectors
    starting at once on one server create the same tables and views, none drops what
    another made. Rebuilding drops and refills them, so it must be the store's only
    writer meanwhile (the start after an upgrade: docs/operations.md)."""
    mine = signature(types)
    rebuild = False
    if kept_signature != mine:
        counted = conn.rows("SELECT count() FROM records")
        rebuild = bool(counted and int(counted[0][0]))
    if rebuild:
        for table in ROLLUP_TABLES:
            conn.command(f"DROP VIEW IF EXISTS {table}_mv")
            conn.command(f"DROP TABLE IF EXISTS {table}")
    for statement in schema_statements(types, retention_seconds):
        conn.command(statement)
    if rebuild:
        n = int(conn.rows("SELECT count() FROM records")[0][0])
        if kept_signature is not None:
            log.info("store: the rollups were defined by another version; rebuilding them")
        log.info("store: building the rollups of %d records", n)
        started = time.monotonic()
        for table, select in VIEWS.items():
            conn.command(f"INSERT INTO {table} {select}")
        log.info("store: rollups built in %.1f s", time.monotonic() - started)
    return mine


def first_kept_period(retention_seconds: float | None, now: float) -> int:
    """The first period whose records are all within the retention (TTL has deleted none
    of them): the rollups are read from it on."""
    if retention_seconds is None:
        return 0
    return max(0, math.ceil((now - retention_seconds + _CLOCK_MARGIN_SECONDS)
                            / S.ROLLUP_SECONDS))


# --- reading them ----------------------------------------------------------------------------


# The sets (measures.py): each one's aggregate over ``records`` rows, and the rollup table
# that keeps it with its aggregate there (the view already kept only its rows).
RAW_SETS = {
    "set:models": "groupUniqArray(coalesce(model, ''))",
    "set:units": "groupUniqArrayIf((node, engine_id), gpu_inventory = 0)",
    "set:unit_gpus": "groupUniqArray((node, engine_id, tensor_parallel))",
}
ROLLED_SETS = {
    "set:models": ("rollup_by", RAW_SETS["set:models"]),
    "set:units": ("rollup_units", "groupUniqArray((node, engine_id))"),
    "set:unit_gpus": ("rollup_gpus", "groupUniqArray((node, engine_id, tensor_parallel))"),
}


def set_member(name: str, value: Any) -> str:
    """A member of the set ``name`` from what its aggregate collected."""
    if name == "set:models":
        return str(value or "")
    if name == "set:units":
        return pricing_unit(*value)
    if name == "set:unit_gpus":
        node, engine_id, gpus = value
        return unit_gpus_item(node, engine_id, int(gpus or 0))
    raise ValueError(f"unknown set {name!r}")


def read(conn: Connection, periods: tuple[int, int | None], sums: Sequence[str],
         histograms: Sequence[str], sets: Sequence[str], group_by: GroupBy
         ) -> dict[Any, Aggregates]:
    """The measures, histograms and sets over the periods ``[first, last)`` (last None:
    to the newest) from the rollups: each key's rows combined (they may not be merged
    yet)."""
    first, last = periods
    where = f"period >= {int(first)}" + ("" if last is None else f" AND period < {int(last)}")
    group = None if group_by is None else str(group_by)
    if group is not None and group not in S.NAME_GROUPS:
        raise ValueError(f"the rollups are not kept by {group_by!r}")
    key = "" if group is None else f"{group}, "
    out: dict[Any, Aggregates] = {}

    def agg(value: Any) -> Aggregates:
        return out.setdefault(value, Aggregates())

    if sums:
        select = ", ".join(f"{S.rollup_function(m)}({S.rollup_column(m)})" for m in sums)
        table = "rollup" if group is None else "rollup_by"
        tail = " HAVING count() > 0" if group is None else f" GROUP BY {group}"
        for row in conn.rows(f"SELECT {key}{select} FROM {table} WHERE {where}{tail}"):
            values = row if group is None else row[1:]
            agg(None if group is None else row[0]).merge(Aggregates(
                {m: v for m, v in zip(sums, values, strict=True) if v is not None}))
    if histograms:
        if group is not None:
            raise ValueError("histograms are not kept by group")
        names = {S.HISTOGRAM_INDEX[h]: h for h in histograms}
        sql = (f"SELECT histogram, bucket, sum(n) FROM rollup_hist WHERE {where} AND "
               f"histogram IN ({', '.join(map(str, names))}) GROUP BY histogram, bucket")
        add_histogram_rows(agg(None), names, conn.rows(sql))
    if sets and group is None:  # one query for them all
        subqueries = ", ".join(f"(SELECT {ROLLED_SETS[name][1]} FROM {ROLLED_SETS[name][0]} "
                               f"WHERE {where})" for name in sets)
        (row,) = conn.rows(f"SELECT {subqueries}")
        for name, members in zip(sets, row, strict=True):
            agg(None).sets.setdefault(name, set()).update(
                set_member(name, member) for member in members)
    for name in sets if group is not None else ():
        if name != "set:models":
            raise ValueError(f"{name} is not kept by group")
        for value, model in conn.rows(f"SELECT DISTINCT {group}, model FROM rollup_by "
                                      f"WHERE {where}"):
            agg(value).sets.setdefault(name, set()).add(set_member(name, model))
    return out


def add_histogram_rows(into: Aggregates, names: Mapping[int, str],
                       rows: Sequence[Sequence[Any]]) -> None:
    """Rows of (histogram index, bucket, count) added to ``into``'s histograms."""
    for index, bucket, count in rows:
        hist = into.histograms.setdefault(names[int(index)], {})
        hist[int(bucket)] = hist.get(int(bucket), 0) + int(count)
