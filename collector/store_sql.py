"""The embedded store's queries: tokenpath.query's measures as SQL over the record columns
(collector/store_layout.py), and the rollups that keep a long window's views cheap.

**Measures.** Each measure name (tokenpath/query.py) has one SQL aggregate over a
``records`` row here; a view asks for the measures it needs and gets one row per group
back: only aggregates cross into Python.

**Rollups.** The writer adds the records it commits to four tables, by SQL over the rows
just inserted, in runs (every ROLLUP_EVERY_RECORDS records or ROLLUP_EVERY_SECONDS, in the
transaction of the batch that completes the run): ``rollup`` holds every unparameterized
measure per period (ROLLUP_SECONDS of end time); ``rollup_by`` the chargeback measures and
the long-context roofline terms per period, tenant, model and pool; ``rollup_hist`` each
histogram's bucket counts per period, packed in one value (the buckets computed in SQL in
one pass over the run, counted by the writer);
``rollup_units`` the pricing units seen without a GPU inventory. Their watermark
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
import math
import re
import sqlite3
import sys
import threading
from array import array
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from tokenpath.collector import store_layout as L
from tokenpath.identity import pricing_unit
from tokenpath.instrumentation.network import DEFAULT_MSS_BYTES
from tokenpath.leaks import CONTEXT_BUCKET_BOUNDS, LONG_CONTEXT_TOKENS
from tokenpath.query import (
    ALL_MEASURES,
    CAUSE_VALUES,
    CONTEXT_BUCKETS,
    DEFAULT_PARAMS,
    HISTOGRAMS,
    LOG_GAMMA,
    NEGATIVE_BASE,
    STAGE_VALUES,
    ZERO_KEY,
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

ROLLUP_SECONDS = 600  # one rollup row per 10 minutes of end time (and group)
ROLLUP_EVERY_RECORDS = 10_000  # the writer adds records to the rollups in runs of this many
ROLLUP_EVERY_SECONDS = 5.0  # or of what it wrote in this long
# The writer's page cache: a run's rows (about 1.2 KB each) stay in it between the passes
# the rollups make over them.
WRITER_CACHE_KIB = 32 * 1024
NAME_GROUPS = ("tenant", "model", "pool")
SAMPLE_CHUNK = 1000


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


# --- rollups ----------------------------------------------------------------------------------

# ``rollup``: every unparameterized measure, per period. ``rollup_by``: the measures grouped
# views ask for (chargeback; the long-context roofline terms by model), per period, tenant,
# model and pool.
ROLLUP_MEASURES = tuple(m for m in ALL_MEASURES if m != "last_doubling")
GROUP_MEASURES = ("n", "input_tokens_pos", "output_tokens_pos", "cost", "energy_pos",
                  "energy_measured_n", "energy_other_n",
                  *(f"{kind}:{i}" for i in range(CONTEXT_BUCKETS) for kind in ("cb_new", "cb_q")))
ROLLUP_SET = frozenset(ROLLUP_MEASURES)
GROUP_SET = frozenset(GROUP_MEASURES)
HISTOGRAM_INDEX = {name: i for i, name in enumerate(HISTOGRAMS)}


def rollup_column(measure: str) -> str:
    return "m_" + measure.replace(":", "__")


_PERIOD = f"CAST(end_unix / {ROLLUP_SECONDS} AS INTEGER)"


def _columns_sql(measures: Sequence[str]) -> str:
    return ",\n    ".join(f"{rollup_column(m)} {'REAL' if _is_float(m) else 'INTEGER'}"
                          for m in measures)


def rollup_schema() -> str:
    return f"""
CREATE TABLE IF NOT EXISTS rollup (
    period INTEGER PRIMARY KEY,
    {_columns_sql(ROLLUP_MEASURES)}
);
CREATE TABLE IF NOT EXISTS rollup_by (
    period INTEGER NOT NULL,
    tenant INTEGER NOT NULL,
    model INTEGER NOT NULL,
    pool INTEGER NOT NULL,
    {_columns_sql(GROUP_MEASURES)},
    PRIMARY KEY (period, tenant, model, pool)
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
"""


ROLLUP_TABLES = ("rollup", "rollup_by", "rollup_hist", "rollup_units")


def _is_float(measure: str) -> bool:
    sql = measure_sql(measure)
    return (sql.startswith("total(") or measure in ("min_start", "max_end")
            or measure.startswith(("ph_s:", "ph_c:")))


def _nullable_sum(measure: str) -> bool:
    return measure.startswith(("ph_s:", "ph_c:"))


def _upsert(table: str, keys: Sequence[str], key_exprs: Sequence[str],
            measures: Sequence[str], where: str = "", grouped: bool = True) -> str:
    columns = [rollup_column(m) for m in measures]
    updates = []
    for measure, column in zip(measures, columns, strict=True):
        if measure.startswith(("min_", "max_")):
            fn = measure[:3]
            updates.append(f"{column} = {fn}(coalesce({column}, excluded.{column}), "
                           f"coalesce(excluded.{column}, {column}))")
        elif _nullable_sum(measure):
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
    by = _upsert("rollup_by", ["period", "tenant", "model", "pool"],
                 [_PERIOD, "coalesce(tenant, 0)", "coalesce(model, 0)", "coalesce(pool, 0)"],
                 GROUP_MEASURES)
    units = ("INSERT OR IGNORE INTO rollup_units(period, node, engine_id) "
             f"SELECT DISTINCT {_PERIOD}, coalesce(node, 0), coalesce(engine_id, 0) "
             "FROM records WHERE rid > ?1 AND rid <= ?2 AND end_unix >= 0 "
             "AND gpu_inventory = 0")
    return by, units


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


# --- windows ----------------------------------------------------------------------------------

Where = tuple[str, list[Any]]  # a condition on records rows and its arguments


def _window_where(window: Window) -> Where:
    conditions, args = [], []
    if window.since_unix is not None:
        conditions.append("end_unix >= ?")
        args.append(window.since_unix)
    if window.until_unix is not None:
        conditions.append("end_unix <= ?")
        args.append(window.until_unix)
    return " AND ".join(conditions) or "1", args


def split_window(window: Window, rollup_from: int | None, rolled_rid: int = 0
                 ) -> tuple[tuple[int, int | None] | None, list[Where]]:
    """The rollup periods ``[first, last)`` the window covers whole (None: none; last None:
    to the newest), and the conditions that select the rest of it from ``records``: the
    partial first and last periods, and the records of the whole periods the rollups do not
    hold yet (past the watermark ``rolled_rid``). A record's period is the rollups' own
    expression, so the parts never overlap."""
    since, until = window.since_unix, window.until_unix
    if rollup_from is None:
        return None, [_window_where(window)]
    first = 0 if since is None or since <= 0 else math.ceil(since / ROLLUP_SECONDS)
    first = max(first, rollup_from)
    last = None if until is None else math.floor(until / ROLLUP_SECONDS)
    if last is not None and last <= first:
        return None, [_window_where(window)]
    parts: list[Where] = []
    head, head_args = _window_where(Window(since, None))
    # the index bounds the scan (a second past the period's start), the period decides
    parts.append((f"{head} AND end_unix < ? AND ({_PERIOD} < ? OR end_unix < 0)",
                  [*head_args, first * ROLLUP_SECONDS + 1.0, first]))
    if last is not None:
        tail, tail_args = _window_where(Window(None, until))
        parts.append((f"end_unix >= ? AND end_unix >= 0 AND {_PERIOD} >= ? AND {tail}",
                       [last * ROLLUP_SECONDS - 1.0, last, *tail_args]))
    newest = "" if last is None else f" AND {_PERIOD} < ?"
    parts.append((f"rid > ? AND end_unix >= 0 AND {_PERIOD} >= ?{newest}",
                   [rolled_rid, first, *([] if last is None else [last])]))
    return (first, last), parts


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
            ).fetchone() is not None
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
        sums = [m for m in measures if not m.startswith("set:")]
        sets = [m for m in measures if m.startswith("set:")]
        with self._lock:
            rollup_from, rolled_rid = self._rollup_state()
            held = (set() if rollup_from is None
                    else self._held(sums, histograms, sets, group_by, params))
            parts = []
            if held:
                periods, wheres = split_window(window, rollup_from, rolled_rid)
                rolled = ([m for m in sums if m in held], [h for h in histograms if h in held],
                          [m for m in sets if m in held])
                parts += [self._raw(w, *rolled, group_by, params) for w in wheres]
                if periods is not None:
                    parts.append(self._from_rollups(periods, *rolled, group_by))
            rest = ([m for m in sums if m not in held], [h for h in histograms if h not in held],
                    [m for m in sets if m not in held])
            if any(rest):
                parts.append(self._raw(_window_where(window), *rest, group_by, params))
        return merge_groups(parts)

    @staticmethod
    def _held(sums: Sequence[str], histograms: Sequence[str], sets: Sequence[str],
              group_by: GroupBy, params: Params) -> set[str]:
        """The measures, histograms and sets the rollups hold for this grouping."""
        if group_by is None:
            held = {m for m in sums if m in ROLLUP_SET}
            held.update(histograms)
            held.update(m for m in sets if m in ("set:models", "set:units"))
        elif group_by in NAME_GROUPS:
            held = {m for m in sums if m in GROUP_SET}
            held.update(m for m in sets if m == "set:models")
        else:
            return set()
        if params.long_context_tokens != DEFAULT_PARAMS.long_context_tokens:
            held = {m for m in held if not m.startswith("lc_")}
        if params.packets_per_token_threshold != DEFAULT_PARAMS.packets_per_token_threshold:
            held.discard("lm_leaking")
        return held

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
            select = ", ".join(
                f"{m[:3]}({rollup_column(m)})" if m.startswith(("min_", "max_"))
                else f"sum({rollup_column(m)})" for m in sums)
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
        return out

    def end_range(self, window: Window) -> tuple[float, float] | None:
        where, args = _window_where(window)
        with self._lock:
            row = self._db.execute(
                f"SELECT min(end_unix), max(end_unix) FROM records WHERE {where}",
                args).fetchone()
        if row is None or row[0] is None:
            return None
        return float(row[0]), float(row[1])

    def count(self, window: Window = Window()) -> int:
        where, args = _window_where(window)
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
        where, args = _window_where(Window(since_unix, until_unix))
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
            where, window_args = _window_where(window)
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
        where, args = _window_where(window)
        if fingerprinted:
            where += " AND prefix_fingerprints IS NOT NULL"
        with self._lock:
            (total,) = self._db.execute(f"SELECT count(*) FROM records WHERE {where}",
                                        args).fetchone()
        records = self._select(f"SELECT {L.SELECT_COLUMNS} FROM records WHERE {where} "
                               "ORDER BY end_unix DESC LIMIT ?", [*args, int(limit)])
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
        with self._lock:
            (oldest,) = self._db.execute("SELECT min(end_unix) FROM records").fetchone()
            retention = self._retention
            if retention is None:
                row = self._db.execute(
                    "SELECT value FROM meta WHERE key = 'retention_seconds'").fetchone()
                retention = float(row[0]) if row is not None else None
        return Coverage(retention, None if oldest is None else float(oldest), now_unix)

