"""The ClickHouse store's SQL: its schema, derived from the column layout, the rows it
writes and reads, and the views' queries (tokenpath.query's measures) in ClickHouse SQL.

**Schema.** Derived from the column layout (collector/store/layout.py), itself derived from
the field table (tokenpath/record_fields.py): one column per layout column, its type from
the field's kind; names (model, tenant, node, pool, engine, status, ...) are
``LowCardinality(String)`` text instead of ids; the lists ``Array(String)``; dollars and
seconds ``Float64``. ``records`` is a MergeTree partitioned by day of end time, ordered by
(end hour, model, end time): every view filters on end time, and the chargeback groups by
model. Rows older than the retention are dropped by the table's TTL. ``schema_version``
records each schema applied; a column the layout gained since is added at start
(ALTER TABLE ADD COLUMN), nothing is dropped. The rollups, which materialized views on
``records`` keep, are collector/store/clickhouse_rollups.py's.

**Queries** are tokenpath.query's measures in ClickHouse SQL (collector/store/measures.py's
measures in its ClickHouse dialect). A window is split as the SQLite store splits it
(measures.plan): its whole periods are read from the rollups, its partial first and
last periods from ``records`` in one query; what the rollups do not hold (a parameter
other than the default, a time-bucketed view) from ``records`` alone. Percentiles come
from the same log-spaced buckets, so the same 1% bound holds.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import tokenpath.collector.store.clickhouse_rollups as R
import tokenpath.collector.store.layout as L
import tokenpath.collector.store.measures as S
from tokenpath import record_fields as RF
from tokenpath.collector.store.clickhouse_client import Connection
from tokenpath.leaks import LONG_CONTEXT_TOKENS
from tokenpath.query import (
    DEFAULT_PARAMS,
    Aggregates,
    Coverage,
    GroupBy,
    Params,
    Sample,
    TimeBuckets,
    Window,
    merge_groups,
)
from tokenpath.records import RequestRecord

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2  # 2: the rollups (collector/store/clickhouse_rollups.py)
DEDUPLICATION_WINDOW = R.DEDUPLICATION_WINDOW

# --- the schema, from the column layout ----------------------------------------------------

_TYPES = {RF.STR: "String", RF.OPT_STR: "Nullable(String)", RF.INT: "Int64",
          RF.OPT_INT: "Nullable(Int64)", RF.FLOAT: "Float64", RF.OPT_FLOAT: "Nullable(Float64)",
          RF.BOOL: "UInt8", RF.OPT_BOOL: "Nullable(UInt8)"}
_TIME_CODEC = "CODEC(Gorilla, ZSTD(1))"
_CODEC = "CODEC(ZSTD(1))"


def column_types() -> dict[str, str]:
    """Each column of :data:`layout.COLUMNS` with its ClickHouse type and codec."""
    out = {"record_id": f"String {_CODEC}", "trace_id": f"Nullable(String) {_CODEC}"}
    for f in L.PLAIN_FIELDS:
        kind = _TYPES[f.kind]
        if f.name.endswith("_unix"):
            out[f.name] = f"{kind} {_TIME_CODEC}"
        elif kind == "Int64":
            out[f.name] = f"{kind} CODEC(T64, ZSTD(1))"
        else:
            out[f.name] = f"{kind} {_CODEC}"
    for f in L.NAME_FIELDS:
        inner = "String" if f.kind == RF.STR else "Nullable(String)"
        out[f.name] = f"LowCardinality({inner})"
    for f in L.LIST_FIELDS:
        out[f.name] = f"Array(String) {_CODEC}"
    for column in L.STAGE_COLUMNS:
        kind = "Nullable(UInt8)" if column.startswith("p_") else "Nullable(Float64)"
        out[column] = f"{kind} {_CODEC}"
    for column in L.PHASE_COLUMNS:
        out[column] = f"Nullable(Float64) {_CODEC}"
    for column in L.CAUSE_COLUMNS:
        kind = "Nullable(Int64)" if column.startswith("mt_") else "Nullable(Float64)"
        out[column] = f"{kind} {_CODEC}"
    out["extra"] = f"Nullable(String) {_CODEC}"
    assert tuple(out) == L.COLUMNS, "the ClickHouse columns follow the layout"
    return out


COLUMN_TYPES = column_types()
_NULLABLE = frozenset(i for i, c in enumerate(L.COLUMNS) if "Nullable(" in COLUMN_TYPES[c])
_INT_COLUMNS = frozenset(i for i, c in enumerate(L.COLUMNS)
                         if "Int64" in COLUMN_TYPES[c] or "UInt8" in COLUMN_TYPES[c])
_NAME_SLOTS = tuple((L.COLUMN_INDEX[f.name], f.name) for f in L.NAME_FIELDS)
_LIST_SLOTS = tuple((L.COLUMN_INDEX[f.name], f.name) for f in L.LIST_FIELDS)
_INT64 = (-(1 << 63), (1 << 63) - 1)
_DAY = "toDate(toDateTime(greatest(end_unix, 0)))"


def _ttl(retention_seconds: float) -> str:
    return R.ttl(retention_seconds, R.RECORDS_TTL_SECONDS)


def schema_statements(retention_seconds: float) -> list[str]:
    columns = ",\n    ".join(f"`{name}` {kind}" for name, kind in COLUMN_TYPES.items())
    dedup = f"non_replicated_deduplication_window = {DEDUPLICATION_WINDOW}"
    return [
        f"""CREATE TABLE IF NOT EXISTS records (
    {columns}
) ENGINE = MergeTree
PARTITION BY {_DAY}
ORDER BY (intDiv(toInt64(greatest(end_unix, 0)), 3600), model, end_unix)
{_ttl(retention_seconds)}
SETTINGS {dedup}""",
        f"""CREATE TABLE IF NOT EXISTS idle_cost (
    pool LowCardinality(String),
    start_unix Float64 {_TIME_CODEC},
    end_unix Float64 {_TIME_CODEC},
    dollars Float64,
    energy_joules Float64
) ENGINE = MergeTree PARTITION BY {_DAY} ORDER BY (end_unix, pool)
{_ttl(retention_seconds)}
SETTINGS {dedup}""",
        f"""CREATE TABLE IF NOT EXISTS joined_traces (
    trace_id String,
    record_id String,
    end_unix Float64
) ENGINE = MergeTree PARTITION BY {_DAY} ORDER BY (trace_id, end_unix)
{_ttl(retention_seconds)}
SETTINGS {dedup}""",
        """CREATE TABLE IF NOT EXISTS meta (
    key String,
    value String,
    at Float64
) ENGINE = ReplacingMergeTree(at) ORDER BY key""",
        """CREATE TABLE IF NOT EXISTS schema_version (
    version UInt32,
    columns_signature String,
    applied_unix Float64
) ENGINE = ReplacingMergeTree(applied_unix) ORDER BY version""",
    ]


COLUMNS_SIGNATURE = hashlib.sha256(json.dumps(COLUMN_TYPES).encode()).hexdigest()[:16]


def _num(value: float) -> str:
    value = float(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return repr(value)


def _bind(where: S.Where) -> str:
    """A condition with its arguments written in place of its ``?``."""
    sql, args = where
    pieces = sql.split("?")
    assert len(pieces) == len(args) + 1, sql
    out = [pieces[0]]
    for arg, piece in zip(args, pieces[1:], strict=True):
        out.append(str(int(arg)) if isinstance(arg, int) else _num(arg))
        out.append(piece)
    return "".join(out)


def _where(window: Window) -> str:
    return _bind(S.window_where(window))


# --- rows ------------------------------------------------------------------------------------


class TextNames(L.Names):
    """The layout's names as ClickHouse keeps them: the text itself."""

    def id_of(self, db: sqlite3.Connection, text: str) -> int:
        return 0  # the row's name columns are set to the texts after encoding

    def text_of(self, db: sqlite3.Connection, name_id: int | None) -> str | None:
        return None if name_id is None else str(name_id)


_NO_DB = cast(sqlite3.Connection, None)


def encode(encoder: L.RowEncoder, r: RequestRecord) -> list[Any]:
    """A record as a ``records`` row: the layout's row with texts for names, lists as
    arrays, NULL for NaN (0 where the column is not nullable)."""
    row = encoder.encode(_NO_DB, r)
    for i, value in enumerate(row):
        if isinstance(value, float):
            if math.isnan(value) or math.isinf(value):
                row[i] = None if i in _NULLABLE else 0.0
            elif i in _INT_COLUMNS:
                row[i] = int(max(_INT64[0], min(_INT64[1], value)))
        elif type(value) is int and not _INT64[0] <= value <= _INT64[1]:
            row[i] = _INT64[0] if value < 0 else _INT64[1]
    tag = row[1]
    row[1] = None if tag is None else str(tag)
    for i, name in _NAME_SLOTS:
        row[i] = getattr(r, name)
    for i, name in _LIST_SLOTS:
        row[i] = [str(item) for item in getattr(r, name)]
    return row


def decode(decoder: L.RowDecoder, row: Sequence[Any]) -> RequestRecord:
    values = list(row)
    if values[1] == "1":
        values[1] = 1
    for i, _ in _LIST_SLOTS:
        values[i] = L.pack_list(tuple(values[i] or ()))
    return decoder.decode(_NO_DB, values)


def ensure_schema(conn: Connection, retention_seconds: float) -> None:
    """Create the tables, add the columns the layout gained, set the retention (TTL) when
    it changed, and record the schema version."""
    for statement in schema_statements(retention_seconds):
        conn.command(statement)
    have = {name for (name,) in conn.rows(
        "SELECT name FROM system.columns WHERE database = currentDatabase() "
        "AND table = 'records'")}
    for name, kind in COLUMN_TYPES.items():
        if name not in have:
            log.warning("store: adding column %s to records", name)
            conn.command(f"ALTER TABLE records ADD COLUMN IF NOT EXISTS `{name}` {kind}")
    rollups = R.ensure(conn, COLUMN_TYPES, retention_seconds, _meta(conn, "rollup"))
    kept = _meta(conn, "retention_seconds")
    if kept is not None and float(kept) != float(retention_seconds):
        ttls = {table: _ttl(retention_seconds) for table in ("records", "idle_cost",
                                                              "joined_traces")}
        ttls.update((table, R.ttl(retention_seconds, R.ttl_seconds(table)))
                    for table in R.ROLLUP_TABLES)
        for table, table_ttl in ttls.items():
            conn.command(f"ALTER TABLE {table} MODIFY {table_ttl} "
                         "SETTINGS materialize_ttl_after_modify = 0")
    now = time.time()
    conn.insert("meta", [["retention_seconds", repr(float(retention_seconds)), now],
                         ["layout", str(L.LAYOUT_VERSION), now], ["rollup", rollups, now]],
                ("key", "value", "at"), f"meta-{now!r}")
    versions = conn.rows("SELECT version, columns_signature FROM schema_version FINAL")
    if (SCHEMA_VERSION, COLUMNS_SIGNATURE) not in versions:
        conn.insert("schema_version", [[SCHEMA_VERSION, COLUMNS_SIGNATURE, now]],
                    ("version", "columns_signature", "applied_unix"), f"schema-{now!r}")


def _meta(conn: Connection, key: str) -> str | None:
    rows = conn.rows(f"SELECT value FROM meta FINAL WHERE key = {S._quote(key)}")
    return str(rows[0][0]) if rows else None


# --- the queries -----------------------------------------------------------------------------


def _by_key(rows: Sequence[Sequence[Any]], grouped: bool
            ) -> dict[Any, list[Sequence[Any]]]:
    """Rows of (group key if ``grouped``, values...) as the values' rows by key."""
    out: dict[Any, list[Sequence[Any]]] = {}
    for row in rows:
        out.setdefault(row[0] if grouped else None, []).append(row[1:] if grouped else row)
    return out



class ClickHouseQueries:
    """tokenpath.query.RecordQueries over ClickHouse."""

    def __init__(self, conn: Connection, retention_seconds: float | None,
                 clock: Callable[[], float] = time.time) -> None:
        """``clock``: the time the retention's edge is counted from (TTL deletes by the
        server's wall clock)."""
        self._conn = conn
        self._decoder = L.RowDecoder(TextNames())
        self._retention = retention_seconds
        self._clock = clock
        self._rollups: bool | None = None  # whether the rollups are this version's

    @staticmethod
    def _group_sql(group_by: GroupBy) -> str | None:
        if group_by is None:
            return None
        if isinstance(group_by, TimeBuckets):
            return (f"least({int(group_by.count) - 1}, toInt64((end_unix - "
                    f"{_num(group_by.start_unix)}) / {_num(group_by.width)}))")
        if group_by not in S.GROUPS:
            raise ValueError(f"cannot group by {group_by!r}")
        return str(group_by)

    def _read_meta(self) -> None:
        """Whether the rollups are this version's, and (read-only) the retention kept."""
        if self._rollups is None:
            kept = dict(self._conn.rows("SELECT key, value FROM meta FINAL WHERE key IN "
                                        "('rollup', 'retention_seconds')"))
            self._rollups = kept.get("rollup") == R.signature(COLUMN_TYPES)
            if self._retention is None and "retention_seconds" in kept:
                self._retention = float(kept["retention_seconds"])

    def _rollup_from(self) -> int | None:
        """The first period the rollups are read from (the retention's edge); None when
        they are not this version's (a store another version wrote, opened read-only)."""
        self._read_meta()
        if not self._rollups:
            return None
        return R.first_kept_period(self._retention, self._clock())

    def aggregate(self, window: Window, measures: Sequence[str],
                  histograms: Sequence[str] = (), group_by: GroupBy = None,
                  params: Params = DEFAULT_PARAMS) -> dict[Any, Aggregates]:
        """The whole periods of the window from the rollups (what they hold for this
        grouping and these parameters), the partial ones at its edges and the rest from
        ``records``: one query for the edges, whose conditions never overlap."""
        split = S.plan(window, measures, histograms, group_by, params, self._rollup_from(),
                       None, S.CLICKHOUSE)
        parts = []
        if split.edges and any(split.rolled):
            edges = " OR ".join(f"({_bind(w)})" for w in split.edges)
            parts.append(self._raw(edges, *split.rolled, group_by, params))
        if split.periods is not None and any(split.rolled):
            parts.append(R.read(self._conn, split.periods, *split.rolled, group_by))
        if any(split.rest):
            parts.append(self._raw(_where(window), *split.rest, group_by, params))
        return merge_groups(parts)

    def _raw(self, where: str, sums: Sequence[str], histograms: Sequence[str],
             sets: Sequence[str], group_by: GroupBy, params: Params
             ) -> dict[Any, Aggregates]:
        """The measures over the ``records`` rows matching ``where``."""
        d = S.CLICKHOUSE
        group = self._group_sql(group_by)
        key_sql = "" if group is None else f"{group} AS grp, "
        group_sql = "" if group is None else " GROUP BY grp"
        out: dict[Any, Aggregates] = {}

        def agg(key: Any) -> Aggregates:
            return out.setdefault(key, Aggregates())

        if sums:
            select = ", ".join(S.measure_sql(m, params, None, d) for m in sums)
            rows_where, table = f"({where})", "records"
            if list(sums) == ["last_doubling"]:  # only long contexts count
                threshold = int(params.long_context_tokens)
                rows_where += f" AND {d.context()} >= {threshold}"
                if (threshold == LONG_CONTEXT_TOKENS and group_by is None
                        and self._rollup_from() is not None):
                    table = "records_long"  # those records' columns alone
            sql = (f"SELECT {key_sql}{select} FROM "
                   f"{S.source_sql(rows_where, select, table, d)}{group_sql} "
                   "HAVING count() > 0")
            for row in self._conn.rows(sql):
                key = None if group is None else row[0]
                values = row if group is None else row[1:]
                agg(key).merge(Aggregates({m: v for m, v in zip(sums, values, strict=True)
                                           if v is not None}))
        if histograms:
            names = {S.HISTOGRAM_INDEX[h]: h for h in histograms}
            rows = self._conn.rows(R.histogram_rows_sql(histograms, f"({where})", group))
            for key, part in _by_key(rows, group is not None).items():
                R.add_histogram_rows(agg(key), names, part)
        if sets:  # one pass for them all
            sql = (f"SELECT {key_sql}{', '.join(R.RAW_SETS[name] for name in sets)} "
                   f"FROM records WHERE {where}{group_sql}")
            for row in self._conn.rows(sql):
                key = None if group is None else row[0]
                values = row if group is None else row[1:]
                for name, members in zip(sets, values, strict=True):
                    agg(key).sets.setdefault(name, set()).update(
                        R.set_member(name, member) for member in members)
        return out

    def end_range(self, window: Window) -> tuple[float, float] | None:
        rows = self._conn.rows(f"SELECT minOrNull(end_unix), maxOrNull(end_unix) FROM records "
                               f"WHERE {_where(window)}")
        if not rows or rows[0][0] is None:
            return None
        return float(rows[0][0]), float(rows[0][1])

    def count(self, window: Window = Window()) -> int:
        return int(self._conn.rows(f"SELECT count() FROM records WHERE {_where(window)}")[0][0])

    def _select(self, sql: str) -> list[RequestRecord]:
        return [decode(self._decoder, row) for row in self._conn.rows(sql)]

    def records(self, limit: int | None = None, since_unix: float | None = None,
                until_unix: float | None = None) -> list[RequestRecord]:
        sql = (f"SELECT {L.SELECT_COLUMNS} FROM records WHERE "
               f"{_where(Window(since_unix, until_unix))} ORDER BY end_unix DESC")
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return self._select(sql)

    def sample(self, window: Window, limit: int, fingerprinted: bool = False) -> Sample:
        where = _where(window)
        if fingerprinted:
            where += " AND notEmpty(prefix_fingerprints)"
        total = int(self._conn.rows(f"SELECT count() FROM records WHERE {where}")[0][0])
        records = self._select(f"SELECT {L.SELECT_COLUMNS} FROM records WHERE {where} "
                               f"ORDER BY end_unix DESC LIMIT {int(limit)}")
        records.reverse()
        return Sample(records, total, int(limit))

    def record(self, record_id: str) -> RequestRecord | None:
        found = self._select(f"SELECT {L.SELECT_COLUMNS} FROM records WHERE "
                             f"record_id = {S._quote(record_id)} LIMIT 1")
        return found[0] if found else None

    def records_of_trace(self, trace_id: str) -> list[RequestRecord]:
        t = S._quote(trace_id)
        records = self._select(
            f"SELECT {L.SELECT_COLUMNS} FROM records WHERE record_id = {t} OR "
            f"startsWith(record_id, {S._quote(trace_id + '-')}) OR record_id IN "
            f"(SELECT record_id FROM joined_traces WHERE trace_id = {t})")
        return sorted(records, key=lambda r: r.start_unix)

    def _idle(self, column: str, since_unix: float | None) -> float:
        where = "" if since_unix is None else f" WHERE end_unix >= {_num(since_unix)}"
        return float(self._conn.rows(f"SELECT sum({column}) FROM idle_cost{where}")[0][0] or 0)

    def idle_cost_dollars(self, since_unix: float | None = None) -> float:
        return self._idle("dollars", since_unix)

    def idle_energy_joules(self, since_unix: float | None = None) -> float:
        return self._idle("energy_joules", since_unix)

    def _oldest_end(self) -> float | None:
        """The oldest record's end time: among the records before the end of the oldest
        period the rollups hold (the primary key skips the rest), else among all."""
        if self._rollup_from() is not None:
            (first,) = self._conn.rows("SELECT minOrNull(period) FROM rollup")[0]
            if first is not None:  # a constant, which the primary key can use
                oldest = self._conn.rows(
                    "SELECT minOrNull(end_unix) FROM records WHERE end_unix < "
                    f"{(int(first) + 1) * S.ROLLUP_SECONDS}")[0][0]
                if oldest is not None:
                    return float(oldest)
        oldest = self._conn.rows("SELECT minOrNull(end_unix) FROM records")[0][0]
        return None if oldest is None else float(oldest)

    def coverage(self, now_unix: float | None = None) -> Coverage:
        oldest = self._oldest_end()
        self._read_meta()
        return Coverage(self._retention, oldest, now_unix)
