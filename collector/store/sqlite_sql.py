"""The embedded store's queries: tokenpath.query's measures (their SQL in
collector/store/measures.py, SQLite's dialect) over the record columns
(collector/store/layout.py), and the rollups that keep a long window's views cheap.

**Rollups.** The writer adds the records it commits to five tables, by SQL over the rows
just inserted, in runs (every ROLLUP_EVERY_RECORDS records or ROLLUP_EVERY_SECONDS, in the
transaction of the batch that completes the run): ``rollup`` holds every unparameterized
measure per period (ROLLUP_SECONDS of end time); ``rollup_by`` the chargeback measures, the
SLO classes' measures and the long-context roofline terms per period, tenant, model, pool
and SLO class; ``rollup_hist`` each
histogram's bucket counts per period, packed in one value (the buckets computed in SQL in
one pass over the run, counted by the writer);
``rollup_units`` the pricing units seen without a GPU inventory; ``rollup_gpus`` the
engines seen and their GPUs (goodput per GPU). Their watermark
(``meta.rollup_rid``) says which records they hold. A window reads the periods it covers
whole from the rollups, and from ``records`` only its partial first and last periods and
the records past the watermark, so ``report --since 24h`` reads about 144 rollup rows
instead of every record. A measure with a non-default parameter, a time-bucketed view,
and a store whose rollups another version wrote (rebuilt when the collector opens it) read
``records`` alone: the same figures, more slowly. Retention deletes whole periods of
rollups; the period it cuts through is read from ``records`` from then on.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import sys
import threading
from array import array
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import tokenpath.collector.store.layout as L
from tokenpath.collector.store.measures import (
    GROUP_MEASURES,
    HISTOGRAM_INDEX,
    NAME_GROUPS,
    ROLLUP_MEASURES,
    ROLLUP_SECONDS,
    SQLITE,
    Where,
    bucket_key_sql,
    histogram_value_sql,
    is_float,
    measure_sql,
    nullable_sum,
    plan,
    rollup_column,
    rollup_function,
    source_sql,
    window_where,
)
from tokenpath.identity import pricing_unit
from tokenpath.leaks import LONG_CONTEXT_TOKENS
from tokenpath.query import (
    DEFAULT_PARAMS,
    HISTOGRAMS,
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
from tokenpath.slo import unit_gpus_item

log = logging.getLogger(__name__)

ROLLUP_EVERY_RECORDS = 10_000  # the writer adds records to the rollups in runs of this many
ROLLUP_EVERY_SECONDS = 5.0  # or of what it wrote in this long
# The writer's page cache: a run's rows (about 1.2 KB each) stay in it between the passes
# the rollups make over them.
WRITER_CACHE_KIB = 32 * 1024
SAMPLE_CHUNK = 1000


# --- rollups ----------------------------------------------------------------------------------

# What each rollup holds is measures.py's (ROLLUP_MEASURES, GROUP_MEASURES, HISTOGRAMS).
_PERIOD = SQLITE.period()
_CONTEXT_SQL = L.CONTEXT_SQL


def _columns_sql(measures: Sequence[str]) -> str:
    return ",\n    ".join(f"{rollup_column(m)} {'REAL' if is_float(m) else 'INTEGER'}"
                          for m in measures)


def rollup_schema() -> str:
    return f"""
CREATE TABLE IF NOT EXISTS rollup (
    period INTEGER PRIMARY KEY,
    {_columns_sql(ROLLUP_MEASURES)}
);
CREATE TABLE IF NOT EXISTS rollup_by (
    period INTEGER NOT NULL,
    {_group_columns_sql()},
    {_columns_sql(GROUP_MEASURES)},
    PRIMARY KEY (period, {", ".join(NAME_GROUPS)})
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rollup_hist (
    period INTEGER NOT NULL,
    histogram INTEGER NOT NULL,
    counts BLOB NOT NULL,
    PRIMARY KEY (period, histogram)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rollup_units (
    period INTEGER NOT NULL,
    node INTEGER NOT NULL,
    engine_id INTEGER NOT NULL,
    PRIMARY KEY (period, node, engine_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rollup_gpus (
    period INTEGER NOT NULL,
    node INTEGER NOT NULL,
    engine_id INTEGER NOT NULL,
    tensor_parallel INTEGER NOT NULL,
    PRIMARY KEY (period, node, engine_id, tensor_parallel)
) WITHOUT ROWID;
"""


def _group_columns_sql() -> str:
    return ",\n    ".join(f"{name} INTEGER NOT NULL" for name in NAME_GROUPS)


ROLLUP_TABLES = ("rollup", "rollup_by", "rollup_hist", "rollup_units", "rollup_gpus")


def _upsert(table: str, keys: Sequence[str], key_exprs: Sequence[str],
            measures: Sequence[str], where: str = "", grouped: bool = True) -> str:
    columns = [rollup_column(m) for m in measures]
    updates = []
    for measure, column in zip(measures, columns, strict=True):
        if measure.startswith(("min_", "max_")):
            fn = measure[:3]
            updates.append(f"{column} = {fn}(coalesce({column}, excluded.{column}), "
                           f"coalesce(excluded.{column}, {column}))")
        elif nullable_sum(measure):
            updates.append(f"{column} = CASE WHEN {column} IS NULL THEN excluded.{column} "
                           f"WHEN excluded.{column} IS NULL THEN {column} "
                           f"ELSE {column} + excluded.{column} END")
        else:
            updates.append(f"{column} = {column} + excluded.{column}")
    groups = (" GROUP BY " + ", ".join(str(i + 1) for i in range(len(keys)))) if grouped \
        else " WHERE true"
    aggregates = ", ".join(measure_sql(m) for m in measures)
    rows = source_sql("rid > ?1 AND rid <= ?2 AND end_unix >= 0" + where, aggregates)
    if not grouped and rows.startswith("records WHERE"):
        groups = ""
    return (f"INSERT INTO {table}({', '.join(keys)}, {', '.join(columns)}) "
            f"SELECT {', '.join(key_exprs)}, {aggregates} FROM {rows}{groups} "
            f"ON CONFLICT({', '.join(keys)}) DO UPDATE SET {', '.join(updates)}")


# The periods of the records with ``rid`` in ``(?1, ?2]``: ``rollup`` is added one period
# at a time (an aggregate over the period's rows, where a GROUP BY would sort every row of
# the run with the ~250 values its measures read).
# Each period's rows are read within the rids it spans (records arrive about in end-time
# order, so the spans are short and barely overlap).
PERIODS_SQL = (f"SELECT {_PERIOD}, min(rid), max(rid) FROM records WHERE rid > ?1 AND "
               "rid <= ?2 AND end_unix >= 0 GROUP BY 1")
PERIOD_UPSERT_SQL = _upsert("rollup", ["period"], ["?3"], ROLLUP_MEASURES,
                            f" AND {_PERIOD} = ?3", grouped=False)


def _rollup_insert_sql() -> tuple[str, ...]:
    """The statements that add the records with ``rid`` in ``(?1, ?2]`` to the grouped
    rollups."""
    by = _upsert("rollup_by", ["period", *NAME_GROUPS],
                 [_PERIOD, *(f"coalesce({name}, 0)" for name in NAME_GROUPS)],
                 GROUP_MEASURES)
    units = ("INSERT OR IGNORE INTO rollup_units(period, node, engine_id) "
             f"SELECT DISTINCT {_PERIOD}, coalesce(node, 0), coalesce(engine_id, 0) "
             "FROM records WHERE rid > ?1 AND rid <= ?2 AND end_unix >= 0 "
             "AND gpu_inventory = 0")
    gpus = ("INSERT OR IGNORE INTO rollup_gpus(period, node, engine_id, tensor_parallel) "
            f"SELECT DISTINCT {_PERIOD}, coalesce(node, 0), coalesce(engine_id, 0), "
            "coalesce(tensor_parallel, 0) FROM records WHERE rid > ?1 AND rid <= ?2 "
            "AND end_unix >= 0")
    return by, units, gpus


ROLLUP_INSERTS = _rollup_insert_sql()
# One pass over a run's records gives every histogram's bucket per record (computed in
# SQL); the writer counts them and adds each bucket once a run.
HISTOGRAM_KEYS_SQL = (
    f"SELECT {_PERIOD}, "
    + ", ".join(f"CASE WHEN {histogram_value_sql(h)[1]} THEN "
                f"{bucket_key_sql(histogram_value_sql(h)[0])} END" for h in HISTOGRAMS)
    + " FROM records WHERE rid > ?1 AND rid <= ?2 AND end_unix >= 0")


def pack_counts(counts: dict[int, int]) -> bytes:
    """A histogram's bucket counts as one value: (bucket, count) pairs of 64-bit
    little-endian integers, by bucket."""
    flat = array("q")
    for key in sorted(counts):
        flat.append(key)
        flat.append(counts[key])
    if sys.byteorder != "little":
        flat.byteswap()
    return flat.tobytes()


def unpack_counts(blob: bytes) -> dict[int, int]:
    flat = array("q")
    flat.frombytes(blob)
    if sys.byteorder != "little":
        flat.byteswap()
    return dict(zip(flat[0::2], flat[1::2], strict=True))
ROLLUP_SIGNATURE = hashlib.sha256(
    "\n".join((rollup_schema(), PERIOD_UPSERT_SQL, *ROLLUP_INSERTS, HISTOGRAM_KEYS_SQL,
               str(ROLLUP_SECONDS))).encode()).hexdigest()[:16]


def add_to_rollups(db: sqlite3.Connection, after_rid: int, last_rid: int) -> None:
    """Add records ``after_rid < rid <= last_rid`` to the rollups and move the rollups'
    watermark (``rollup_rid``) to ``last_rid``, inside the caller's transaction. The
    writer adds records in runs of up to ROLLUP_EVERY_RECORDS (or ROLLUP_EVERY_SECONDS):
    a bucket's counts are written once a run, not once a batch; a query reads the records
    past the watermark from ``records``."""
    periods = db.execute(PERIODS_SQL, (after_rid, last_rid)).fetchall()
    for period, first, last in periods:
        db.execute(PERIOD_UPSERT_SQL, (first - 1, last, period))
    for sql in ROLLUP_INSERTS:
        db.execute(sql, (after_rid, last_rid))
    rows = db.execute(HISTOGRAM_KEYS_SQL, (after_rid, last_rid)).fetchall()
    if rows:
        # a period's histogram is one row of packed counts: read, added to, written back
        columns = list(zip(*rows, strict=True))
        for histogram, keys in enumerate(columns[1:]):
            by_period: dict[int, dict[int, int]] = {}
            for (period, key), n in Counter(zip(columns[0], keys, strict=True)).items():
                if key is not None:
                    by_period.setdefault(period, {})[key] = n
            for period, counts in by_period.items():
                row = db.execute("SELECT counts FROM rollup_hist WHERE period = ? AND "
                                 "histogram = ?", (period, histogram)).fetchone()
                if row is not None:
                    for key, n in unpack_counts(row[0]).items():
                        counts[key] = counts.get(key, 0) + n
                db.execute("INSERT OR REPLACE INTO rollup_hist(period, histogram, counts) "
                           "VALUES (?, ?, ?)", (period, histogram, pack_counts(counts)))
    db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('rollup_rid', ?)",
               (str(last_rid),))


def rollup_watermark(db: sqlite3.Connection) -> int:
    row = db.execute("SELECT value FROM meta WHERE key = 'rollup_rid'").fetchone()
    return 0 if row is None else int(row[0])


def rebuild_rollups(db: sqlite3.Connection, chunk: int = 50_000) -> None:
    """Drop the rollups and add every record again, ``chunk`` records a transaction."""
    db.executescript("".join(f"DROP TABLE IF EXISTS {t};" for t in ROLLUP_TABLES))
    db.executescript(rollup_schema())
    (last,) = db.execute("SELECT coalesce(max(rid), 0) FROM records").fetchone()
    (count,) = db.execute("SELECT count(*) FROM records").fetchone()
    if count:
        log.info("store: building the rollups of %d records", count)
    done = 0
    while done < last:
        upto = min(last, done + chunk)
        db.execute("BEGIN")
        add_to_rollups(db, done, upto)
        db.execute("COMMIT")
        done = upto
    db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('rollup_from_period', '0')")
    db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('rollup_rid', ?)", (str(done),))
    db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('rollup', ?)",
               (ROLLUP_SIGNATURE,))


def ensure_rollups(db: sqlite3.Connection) -> None:
    """Rollups that match this version's measures (a read-write store only)."""
    row = db.execute("SELECT value FROM meta WHERE key = 'rollup'").fetchone()
    if row is not None and row[0] == ROLLUP_SIGNATURE:
        return
    if row is not None:
        log.info("store: the rollups were written by another version; rebuilding them")
    rebuild_rollups(db)


def apply_rollup_retention(db: sqlite3.Connection, cutoff: float) -> None:
    """Retention deleted the records that ended before ``cutoff``: delete the rollups of
    every period up to the one it cuts through, which is read from ``records`` from now on
    (inside the caller's transaction)."""
    if cutoff < 0:
        return
    period = int(cutoff // ROLLUP_SECONDS)
    for table in ROLLUP_TABLES:
        db.execute(f"DELETE FROM {table} WHERE period <= ?", (period,))
    row = db.execute("SELECT value FROM meta WHERE key = 'rollup_from_period'").fetchone()
    if row is None or int(row[0]) <= period:
        db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('rollup_from_period', ?)",
                   (str(period + 1),))


# --- the queries ------------------------------------------------------------------------------


class SqliteQueries:
    """tokenpath.query.RecordQueries over a store's connection."""

    def __init__(self, db: sqlite3.Connection, lock: threading.Lock, names: L.Names,
                 retention_seconds: float | None) -> None:
        self._db = db
        self._lock = lock
        self._names = names
        self._decoder = L.RowDecoder(names)
        self._retention = retention_seconds
        self._long_index: bool | None = None

    # rollups usable from this period on; None: not usable at all
    def _rollup_state(self) -> tuple[int | None, int]:
        """(the first period the rollups hold, None when unusable; their watermark)."""
        try:
            rows = dict(self._db.execute(
                "SELECT key, value FROM meta WHERE key IN "
                "('rollup', 'rollup_from_period', 'rollup_rid')"))
        except sqlite3.OperationalError:
            return None, 0
        if rows.get("rollup") != ROLLUP_SIGNATURE:
            return None, 0
        return int(rows.get("rollup_from_period", "0")), int(rows.get("rollup_rid", "0"))

    def _has_long_index(self) -> bool:
        if self._long_index is None:
            self._long_index = self._db.execute(
                "SELECT 1 FROM sqlite_master WHERE name = 'records_long' UNION ALL "
                "SELECT 1 FROM sqlite_temp_master WHERE name = 'records_long'"
            ).fetchone() is not None and self._db.execute(  # not a reader's view of it
                "SELECT 1 FROM sqlite_temp_master WHERE name = 'records' AND type = 'view'"
            ).fetchone() is None
        return self._long_index

    def _text(self, name_id: int | None) -> str | None:
        if not name_id:
            return None
        return self._names.text_of(self._db, name_id)

    def aggregate(self, window: Window, measures: Sequence[str],
                  histograms: Sequence[str] = (), group_by: GroupBy = None,
                  params: Params = DEFAULT_PARAMS) -> dict[Any, Aggregates]:
        """What the rollups hold for this grouping and these parameters comes from them
        (and the window's partial periods from ``records``); the rest from ``records``."""
        with self._snapshot():
            rollup_from, rolled_rid = self._rollup_state()
            split = plan(window, measures, histograms, group_by, params, rollup_from,
                         rolled_rid)
            parts = [self._raw(w, *split.rolled, group_by, params) for w in split.edges]
            if split.periods is not None:
                parts.append(self._from_rollups(split.periods, *split.rolled, group_by))
            if any(split.rest):
                parts.append(self._raw(window_where(window), *split.rest, group_by, params))
        return merge_groups(parts)

    @contextmanager
    def _snapshot(self) -> Iterator[None]:
        """The lock, and one read transaction: a read of several statements (the rollups'
        watermark, then the records past it, then the rollups) sees one state of the file,
        though the writer commits on its own connection in between."""
        with self._lock:
            if self._db.in_transaction:  # the writer's own connection (an in-memory store)
                yield
                return
            self._db.execute("BEGIN")
            try:
                yield
            finally:
                self._db.execute("COMMIT")

    def _group_sql(self, group_by: GroupBy) -> str:
        if group_by is None:
            return "NULL"
        if isinstance(group_by, TimeBuckets):
            return (f"min({int(group_by.count) - 1}, CAST((end_unix - "
                    f"{float(group_by.start_unix)!r}) / {float(group_by.width)!r} AS INTEGER))")
        if group_by not in NAME_GROUPS:
            raise ValueError(f"cannot group by {group_by!r}")
        return group_by

    def _key(self, group_by: GroupBy, value: Any) -> Any:
        if group_by is None or isinstance(group_by, TimeBuckets):
            return value
        return self._text(value)

    def _raw(self, where_part: Where, sums: list[str], histograms: Sequence[str],
             sets: list[str], group_by: GroupBy, params: Params) -> dict[Any, Aggregates]:
        out: dict[Any, Aggregates] = {}
        group = self._group_sql(group_by)
        if sums:
            args: list[Any] = []
            select = ", ".join(measure_sql(m, params, args) for m in sums)
            where = where_part[0]
            args += where_part[1]
            table = "records"
            if sums == ["last_doubling"]:  # only long contexts count: skip the others early
                threshold = int(params.long_context_tokens)
                if threshold == LONG_CONTEXT_TOKENS and self._has_long_index():
                    where += f" AND {L.LONG_CONTEXT_SQL}"
                    table = "records INDEXED BY records_long"
                else:
                    where += f" AND {_CONTEXT_SQL} >= {threshold}"
            sql = (f"SELECT {group}, {select} FROM {source_sql(where, select, table)} "
                   "GROUP BY 1")
            for row in self._db.execute(sql, args):
                key = self._key(group_by, row[0])
                agg = out.setdefault(key, Aggregates())
                agg.merge(Aggregates({m: v for m, v in zip(sums, row[1:], strict=True)
                                      if v is not None}))
        for name in histograms:
            value, condition = histogram_value_sql(name)
            where, args = where_part
            sql = (f"SELECT {group}, {bucket_key_sql(value)}, count(*) FROM records "
                   f"WHERE {where} AND {condition} GROUP BY 1, 2")
            for key_value, bucket, count in self._db.execute(sql, args):
                hist = out.setdefault(self._key(group_by, key_value),
                                      Aggregates()).histograms.setdefault(name, {})
                hist[bucket] = hist.get(bucket, 0) + count
        for name in sets:
            where, args = where_part
            if name == "set:models":
                sql = f"SELECT DISTINCT {group}, model FROM records WHERE {where}"
                for key_value, model in self._db.execute(sql, args):
                    text = self._text(model) or ""
                    out.setdefault(self._key(group_by, key_value),
                                   Aggregates()).sets.setdefault(name, set()).add(text)
            elif name == "set:units":
                sql = (f"SELECT DISTINCT {group}, node, engine_id FROM records "
                       f"WHERE {where} AND gpu_inventory = 0")
                for key_value, node, engine_id in self._db.execute(sql, args):
                    unit = pricing_unit(self._text(node), self._text(engine_id))
                    out.setdefault(self._key(group_by, key_value),
                                   Aggregates()).sets.setdefault(name, set()).add(unit)
            elif name == "set:unit_gpus":
                sql = (f"SELECT DISTINCT {group}, node, engine_id, tensor_parallel "
                       f"FROM records WHERE {where}")
                for key_value, node, engine_id, gpus in self._db.execute(sql, args):
                    out.setdefault(self._key(group_by, key_value),
                                   Aggregates()).sets.setdefault(name, set()).add(
                        unit_gpus_item(self._text(node), self._text(engine_id),
                                       int(gpus or 0)))
            else:
                raise ValueError(f"unknown set {name!r}")
        return out

    def _from_rollups(self, periods: tuple[int, int | None], sums: list[str],
                      histograms: Sequence[str], sets: list[str], group_by: GroupBy
                      ) -> dict[Any, Aggregates]:
        first, last = periods
        args: list[Any] = [first]
        where = "period >= ?"
        if last is not None:
            where += " AND period < ?"
            args.append(last)
        group = "NULL" if group_by is None else str(group_by)
        out: dict[Any, Aggregates] = {}
        if sums:
            select = ", ".join(f"{rollup_function(m)}({rollup_column(m)})" for m in sums)
            table = "rollup" if group_by is None else "rollup_by"
            sql = f"SELECT {group}, {select} FROM {table} WHERE {where} GROUP BY 1"
            for row in self._db.execute(sql, args):
                values = {m: v for m, v in zip(sums, row[1:], strict=True) if v is not None}
                out.setdefault(self._key(group_by, row[0]), Aggregates()).merge(
                    Aggregates(values))
        if histograms:
            if group_by is not None:
                raise ValueError("histograms are not kept by group")
            indexes = {HISTOGRAM_INDEX[h]: h for h in histograms}
            marks = ", ".join("?" for _ in indexes)
            sql = (f"SELECT histogram, counts FROM rollup_hist WHERE {where} "
                   f"AND histogram IN ({marks})")
            agg = out.setdefault(None, Aggregates())
            for index, blob in self._db.execute(sql, [*args, *indexes]):
                hist = agg.histograms.setdefault(indexes[index], {})
                for bucket, count in unpack_counts(blob).items():
                    hist[bucket] = hist.get(bucket, 0) + count
        for name in sets:
            if name == "set:models":
                sql = f"SELECT DISTINCT {group}, model FROM rollup_by WHERE {where}"
                for key_value, model in self._db.execute(sql, args):
                    out.setdefault(self._key(group_by, key_value), Aggregates()).sets \
                        .setdefault(name, set()).add(self._text(model) or "")
            elif name == "set:units":
                if group_by is not None:
                    raise ValueError("units are not kept by group")
                sql = f"SELECT DISTINCT node, engine_id FROM rollup_units WHERE {where}"
                for node, engine_id in self._db.execute(sql, args):
                    out.setdefault(None, Aggregates()).sets.setdefault(name, set()).add(
                        pricing_unit(self._text(node), self._text(engine_id)))
            elif name == "set:unit_gpus":
                if group_by is not None:
                    raise ValueError("engines' GPUs are not kept by group")
                sql = (f"SELECT DISTINCT node, engine_id, tensor_parallel FROM rollup_gpus "
                       f"WHERE {where}")
                for node, engine_id, gpus in self._db.execute(sql, args):
                    out.setdefault(None, Aggregates()).sets.setdefault(name, set()).add(
                        unit_gpus_item(self._text(node), self._text(engine_id), int(gpus)))
        return out

    def end_range(self, window: Window) -> tuple[float, float] | None:
        where, args = window_where(window)
        with self._lock:
            row = self._db.execute(
                f"SELECT min(end_unix), max(end_unix) FROM records WHERE {where}",
                args).fetchone()
        if row is None or row[0] is None:
            return None
        return float(row[0]), float(row[1])

    def count(self, window: Window = Window()) -> int:
        where, args = window_where(window)
        with self._lock:
            (n,) = self._db.execute(f"SELECT count(*) FROM records WHERE {where}",
                                    args).fetchone()
        return int(n)

    def _select(self, sql: str, args: Sequence[Any]) -> list[RequestRecord]:
        with self._lock:
            rows = self._db.execute(sql, args).fetchall()
            return [self._decoder.decode(self._db, row) for row in rows]

    def records(self, limit: int | None = None, since_unix: float | None = None,
                until_unix: float | None = None) -> list[RequestRecord]:
        where, args = window_where(Window(since_unix, until_unix))
        sql = f"SELECT {L.SELECT_COLUMNS} FROM records WHERE {where} ORDER BY end_unix DESC"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        return self._select(sql, args)

    def iter_records(self, window: Window = Window()) -> Iterator[RequestRecord]:
        """Every record of the window, oldest first, a chunk at a time (for a replay that
        must see them all; memory stays one chunk)."""
        after = (float("-inf"), 0)
        while True:
            where, window_args = window_where(window)
            args: list[Any] = [after[0], after[0], after[1], *window_args]
            sql = (f"SELECT rid, {L.SELECT_COLUMNS} FROM records WHERE "
                   f"(end_unix > ? OR (end_unix = ? AND rid > ?)) AND {where} "
                   f"ORDER BY end_unix, rid LIMIT {SAMPLE_CHUNK}")
            with self._lock:
                rows = self._db.execute(sql, args).fetchall()
                chunk = [(row[0], self._decoder.decode(self._db, row[1:])) for row in rows]
            for _, record in chunk:
                yield record
            if len(rows) < SAMPLE_CHUNK:
                return
            after = (chunk[-1][1].end_unix, chunk[-1][0])

    def sample(self, window: Window, limit: int, fingerprinted: bool = False) -> Sample:
        where, args = window_where(window)
        if fingerprinted:
            where += " AND prefix_fingerprints IS NOT NULL"
        with self._snapshot():
            (total,) = self._db.execute(f"SELECT count(*) FROM records WHERE {where}",
                                        args).fetchone()
            rows = self._db.execute(f"SELECT {L.SELECT_COLUMNS} FROM records WHERE {where} "
                                    "ORDER BY end_unix DESC LIMIT ?",
                                    [*args, int(limit)]).fetchall()
            records = [self._decoder.decode(self._db, row) for row in rows]
        records.reverse()
        return Sample(records, int(total), int(limit))

    def record(self, record_id: str) -> RequestRecord | None:
        found = self._select(f"SELECT {L.SELECT_COLUMNS} FROM records WHERE record_id = ?",
                             [record_id])
        return found[0] if found else None

    def records_of_trace(self, trace_id: str) -> list[RequestRecord]:
        # record ids are "<trace id>" or "<trace id>-<span id>": a range on the unique index
        records = self._select(
            f"SELECT {L.SELECT_COLUMNS} FROM records WHERE record_id = ? OR "
            "(record_id >= ? AND record_id < ?) OR record_id IN "
            "(SELECT record_id FROM joined_traces WHERE trace_id = ?) ORDER BY end_unix",
            [trace_id, trace_id + "-", trace_id + ".", trace_id])
        return sorted(records, key=lambda r: r.start_unix)

    def idle_sum(self, column: str, since_unix: float | None) -> float:
        assert column in ("dollars", "energy_joules")
        sql = f"SELECT COALESCE(SUM({column}), 0) FROM idle_cost"
        args: list[object] = []
        if since_unix is not None:
            sql += " WHERE end_unix >= ?"
            args.append(since_unix)
        try:
            with self._lock:
                (total,) = self._db.execute(sql, args).fetchone()
        except sqlite3.OperationalError:  # a store written before the column, read-only
            if column == "dollars":
                raise
            return 0.0
        return float(total)

    def idle_cost_dollars(self, since_unix: float | None = None) -> float:
        return self.idle_sum("dollars", since_unix)

    def idle_energy_joules(self, since_unix: float | None = None) -> float:
        return self.idle_sum("energy_joules", since_unix)

    def coverage(self, now_unix: float | None = None) -> Coverage:
        with self._snapshot():
            (oldest,) = self._db.execute("SELECT min(end_unix) FROM records").fetchone()
            retention = self._retention
            if retention is None:
                row = self._db.execute(
                    "SELECT value FROM meta WHERE key = 'retention_seconds'").fetchone()
                retention = float(row[0]) if row is not None else None
        return Coverage(retention, None if oldest is None else float(oldest), now_unix)

