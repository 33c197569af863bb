"""The store's record layout: one row of typed columns per record, derived from the field
table (tokenpath/record_fields.py).

- Each scalar field is a column of its own type (``REAL``, ``INTEGER``, ``TEXT``).
- Low-cardinality strings (model, tenant, node, pool, engine, status, ...) are integer
  ids into the ``names`` table: a byte or two a record instead of the text.
- The 15 stages are wide columns: ``s_<stage>`` seconds, ``c_<stage>`` dollars and
  ``p_<stage>`` provenance (its rank: 0 measured, 1 derived, 2 modeled; NULL: the record
  has no such stage), and ``f_<stage>_<phase>_s``/``_c`` the seconds and dollars of each
  phase share (NULL: no such share).
- Prefix-cache misses by cause are ``mt_<cause>`` tokens and ``md_<cause>`` dollars.
- The variable-length lists (prefix fingerprints, joined trace ids) are one packed column
  each: the hex strings as raw bytes when they all are lowercase hex of one length (8
  bytes a 16-hex fingerprint), else their JSON. Joined trace ids also have their own rows
  in ``joined_traces`` (trace -> record), which the trace lookup reads.
- ``trace_id`` is NULL when the record id is the trace id, 1 when the record id is
  ``<trace id>-<span id>``; only another shape spells it out.
- ``extra`` holds what no column holds (miss causes that are not MissCause values), as
  JSON; NULL nearly always.

A record is rebuilt from its row for the views that list records (one record, a bounded
page); aggregate views never rebuild records (collector/store/sqlite_sql.py). A non-finite float,
which no record should hold, is stored as NULL, read back as 0 (None for an optional
field); an integer past 64 bits is stored as a REAL.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from operator import attrgetter
from typing import Any

import orjson

from tokenpath import record_fields as RF
from tokenpath.leaks import LONG_CONTEXT_TOKENS, MissCause
from tokenpath.metric_names import UNKNOWN
from tokenpath.records import PhaseShare, RequestRecord, StageTiming
from tokenpath.stages import PROVENANCE_RANK, STAGE_IDS, Phase, Provenance

log = logging.getLogger(__name__)

LAYOUT_VERSION = 2  # 1: the JSON body in ``requests``
PHASES: tuple[Phase, ...] = tuple(Phase)
CAUSES: tuple[str, ...] = tuple(c.value for c in MissCause)
PROVENANCE_OF_RANK: dict[int, Provenance] = {rank: p for p, rank in PROVENANCE_RANK.items()}

_SQL_TYPES = {RF.STR: "TEXT", RF.OPT_STR: "TEXT", RF.INT: "INTEGER", RF.OPT_INT: "INTEGER",
              RF.FLOAT: "REAL", RF.OPT_FLOAT: "REAL", RF.BOOL: "INTEGER",
              RF.OPT_BOOL: "INTEGER"}
_FLOAT_KINDS = (RF.FLOAT, RF.OPT_FLOAT)
_INT_LIMIT = 1 << 63


def stage_column(prefix: str, stage: str) -> str:
    return f"{prefix}_{stage}"


def phase_column(stage: str, phase: str, what: str) -> str:
    return f"f_{stage}_{phase}_{what}"


# --- the columns, from the field table --------------------------------------------------------

# Scalar fields kept as typed columns, in table order (record_id and trace_id come first).
PLAIN_FIELDS: tuple[RF.RecordField, ...] = tuple(
    f for f in RF.FIELDS if f.storage == RF.COLUMN and f.name not in ("record_id", "trace_id"))
NAME_FIELDS: tuple[RF.RecordField, ...] = tuple(f for f in RF.FIELDS if f.storage == RF.NAME)
LIST_FIELDS: tuple[RF.RecordField, ...] = tuple(f for f in RF.FIELDS if f.storage == RF.LIST)
STAGE_COLUMNS: tuple[str, ...] = tuple(
    stage_column(prefix, s.value) for s in STAGE_IDS for prefix in ("s", "c", "p"))
PHASE_COLUMNS: tuple[str, ...] = tuple(
    phase_column(s.value, p.value, what) for s in STAGE_IDS for p in PHASES
    for what in ("s", "c"))
CAUSE_COLUMNS: tuple[str, ...] = tuple(
    f"{prefix}_{cause}" for cause in CAUSES for prefix in ("mt", "md"))

COLUMNS: tuple[str, ...] = (
    "record_id", "trace_id", *(f.name for f in PLAIN_FIELDS), *(f.name for f in NAME_FIELDS),
    *(f.name for f in LIST_FIELDS), *STAGE_COLUMNS, *PHASE_COLUMNS, *CAUSE_COLUMNS, "extra")
COLUMN_INDEX: dict[str, int] = {name: i for i, name in enumerate(COLUMNS)}


def _column_definitions() -> list[str]:
    out = ["rid INTEGER PRIMARY KEY", "record_id TEXT NOT NULL UNIQUE", "trace_id"]
    for f in PLAIN_FIELDS:
        not_null = " NOT NULL" if f.name == "end_unix" else ""
        out.append(f"{f.name} {_SQL_TYPES[f.kind]}{not_null}")
    out += [f"{f.name} INTEGER" for f in NAME_FIELDS]
    out += [f"{f.name} BLOB" for f in LIST_FIELDS]
    for s in STAGE_IDS:
        out += [f"s_{s.value} REAL", f"c_{s.value} REAL", f"p_{s.value} INTEGER"]
    out += [f"{name} REAL" for name in PHASE_COLUMNS]
    for cause in CAUSES:
        out += [f"mt_{cause} INTEGER", f"md_{cause} REAL"]
    out.append("extra TEXT")
    return out


# The long-context records (context past tokenpath.leaks.LONG_CONTEXT_TOKENS) have an
# index of their own: what only they count (the last doubling's prefill dollars) reads them
# alone instead of every record of the window.
CONTEXT_SQL = "(max(0, input_tokens) + max(0, output_tokens))"
LONG_CONTEXT_SQL = f"{CONTEXT_SQL} >= {LONG_CONTEXT_TOKENS}"


def schema_sql(schema: str = "main") -> str:
    """The record tables (``records``, ``names``, ``meta``) in ``schema``: ``main``, or
    ``temp`` for a read-only reader of a store in the JSON layout."""
    columns = ",\n    ".join(_column_definitions())
    return f"""
CREATE TABLE IF NOT EXISTS {schema}.records (
    {columns}
);
CREATE INDEX IF NOT EXISTS {schema}.records_end ON records(end_unix);
CREATE INDEX IF NOT EXISTS {schema}.records_long ON records(end_unix) WHERE {LONG_CONTEXT_SQL};
CREATE TABLE IF NOT EXISTS {schema}.names (
    id INTEGER PRIMARY KEY,
    text TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS {schema}.meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""


def add_missing_columns(db: sqlite3.Connection) -> list[str]:
    """Add to ``records`` the columns the layout gained since the store was written (a
    field added to the table: NULL in the rows written before); returns their names."""
    have = {row[1] for row in db.execute("PRAGMA main.table_info(records)")}
    added = []
    for definition in _column_definitions():
        name = definition.split()[0]
        if name not in have and "PRIMARY KEY" not in definition:
            db.execute(f"ALTER TABLE records ADD COLUMN {definition}")
            added.append(name)
    if added:
        log.warning("store: added columns %s to records", ", ".join(added))
    return added


def cover_missing_columns(db: sqlite3.Connection) -> list[str]:
    """For a read-only reader of a store written before the layout gained columns: a
    temporary view ``records`` over the file's table with those columns as NULL (the
    temp schema is searched first, so the views read it; the file is not changed).
    Returns the columns it covers."""
    have = {row[1] for row in db.execute("PRAGMA main.table_info(records)")}
    missing = [name for name in COLUMNS if name not in have]
    if missing:
        nulls = ", ".join(f"NULL AS {name}" for name in missing)
        db.execute(f"CREATE TEMP VIEW IF NOT EXISTS records AS "
                   f"SELECT *, {nulls} FROM main.records")
    return missing


INSERT_SQL = (f"INSERT OR IGNORE INTO records({', '.join(COLUMNS)}) "
              f"VALUES ({', '.join('?' for _ in COLUMNS)})")
SELECT_COLUMNS = ", ".join(COLUMNS)


# --- names ------------------------------------------------------------------------------------


class Names:
    """The ``names`` table's text <-> id, cached; the writer adds names as it meets them."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._texts: dict[int, str] = {}

    def load(self, db: sqlite3.Connection) -> None:
        for name_id, text in db.execute("SELECT id, text FROM names"):
            self._ids[text] = name_id
            self._texts[name_id] = text

    def id_of(self, db: sqlite3.Connection, text: str) -> int:
        """The id of ``text``, added to the table when new (inside the writer's
        transaction: a rolled-back batch forgets it again, see :meth:`forget`)."""
        name_id = self._ids.get(text)
        if name_id is None:
            cur = db.execute("INSERT INTO names(text) VALUES (?) ON CONFLICT(text) DO UPDATE "
                             "SET text = excluded.text RETURNING id", (text,))
            (name_id,) = cur.fetchone()
            cur.close()
            self._ids[text] = name_id
            self._texts[name_id] = text
        return name_id

    def known_id(self, text: str) -> int | None:
        return self._ids.get(text)

    @property
    def ids(self) -> dict[str, int]:
        """text -> id of the names met so far (read-only to callers)."""
        return self._ids

    def text_of(self, db: sqlite3.Connection, name_id: int | None) -> str | None:
        if name_id is None:
            return None
        text = self._texts.get(name_id)
        if text is None:  # written since this reader loaded the table
            self.load(db)
            text = self._texts.get(name_id)
        return text

    def forget(self) -> None:
        self._ids.clear()
        self._texts.clear()


# --- lists ------------------------------------------------------------------------------------

_PACKED, _JSON = 1, 0


def pack_list(items: Sequence[str]) -> bytes | None:
    """A list of strings as one column: ``[1, item length] + raw bytes`` when every item
    is lowercase hex of one even length (fingerprints, trace ids), else ``[0] + JSON``."""
    if not items:
        return None
    first = len(items[0])
    if 0 < first < 512 and not first % 2:
        joined = "".join(items)
        if len(joined) == first * len(items):
            try:
                raw = bytes.fromhex(joined)
            except ValueError:
                raw = b""
            if raw and raw.hex() == joined:
                return bytes((_PACKED, first // 2)) + raw
    return bytes((_JSON,)) + orjson.dumps(list(items))


def unpack_list(value: bytes | None) -> tuple[str, ...]:
    if not value:
        return ()
    if value[0] == _PACKED:
        size = value[1]
        raw = value[2:].hex()
        width = size * 2
        return tuple(raw[i:i + width] for i in range(0, len(raw), width))
    return tuple(str(item) for item in orjson.loads(value[1:]))


# --- record -> row ----------------------------------------------------------------------------

_STAGE_OFFSET = COLUMN_INDEX[STAGE_COLUMNS[0]]
_PHASE_OFFSET = COLUMN_INDEX[PHASE_COLUMNS[0]]
_CAUSE_OFFSET = COLUMN_INDEX[CAUSE_COLUMNS[0]]
_STAGE_SLOT = {s: i * 3 for i, s in enumerate(STAGE_IDS)}
_PHASE_SLOT = {(s, p): (i * len(PHASES) + j) * 2
               for i, s in enumerate(STAGE_IDS) for j, p in enumerate(PHASES)}
_CAUSE_SLOT = {cause: i * 2 for i, cause in enumerate(CAUSES)}
_BLOCK_SIZE = len(STAGE_COLUMNS) + len(PHASE_COLUMNS)
_PLAIN = attrgetter(*(f.name for f in PLAIN_FIELDS))
_PLAIN_FLOAT_SLOTS = tuple(i for i, f in enumerate(PLAIN_FIELDS) if f.kind in _FLOAT_KINDS)
_OPTIONAL_SLOTS = frozenset(
    COLUMN_INDEX[f.name] for f in PLAIN_FIELDS if f.kind == RF.OPT_FLOAT)
_FLOAT_COLUMNS = frozenset(
    [COLUMN_INDEX[f.name] for f in PLAIN_FIELDS if f.kind in _FLOAT_KINDS]
    + [COLUMN_INDEX[c] for c in (*STAGE_COLUMNS, *PHASE_COLUMNS)
       if not c.startswith("p_")]
    + [COLUMN_INDEX[c] for c in CAUSE_COLUMNS if c.startswith("md_")])
_RANK = {p: rank for p, rank in PROVENANCE_RANK.items()}


def trace_tag(record_id: str, trace_id: str) -> str | int | float:
    if record_id == trace_id:
        return NULL
    if record_id.startswith(trace_id + "-") and "-" not in record_id[len(trace_id) + 1:]:
        return 1
    return trace_id


def trace_of(record_id: str, tag: str | int | None) -> str:
    if tag is None:
        return record_id
    if tag == 1:
        return record_id.rsplit("-", 1)[0]
    return str(tag)


# NULL is bound as a NaN float: SQLite stores a NaN as NULL, and Python's sqlite3 binds a
# float directly where it sends None (and bool, and bytes) through its adaptation lookup,
# about 0.3 µs a value (a row has about 200 columns, most of them NULL).
NULL = math.nan
_NAMES = attrgetter(*(f.name for f in NAME_FIELDS))
_BOOL_SLOTS = tuple(2 + i for i, f in enumerate(PLAIN_FIELDS) if f.kind in (RF.BOOL, RF.OPT_BOOL))


class RowEncoder:
    """RequestRecord -> a row of :data:`COLUMNS` (name ids through ``names``)."""

    def __init__(self, names: Names) -> None:
        self._names = names

    def encode(self, db: sqlite3.Connection, r: RequestRecord) -> list[Any]:
        names = self._names
        plain = _PLAIN(r)
        check = 0.0
        for i in _PLAIN_FLOAT_SLOTS:
            value = plain[i]
            if value is not None:
                check += value
        block: list[Any] = [NULL] * _BLOCK_SIZE
        phase_base = len(STAGE_COLUMNS)
        for stage, timing in r.stages.items():
            slot = _STAGE_SLOT[stage]
            seconds, dollars = timing.seconds, timing.cost_dollars
            check += seconds + dollars
            block[slot] = seconds
            block[slot + 1] = dollars
            block[slot + 2] = _RANK[timing.provenance]
            for phase, share in timing.phases.items():
                at = phase_base + _PHASE_SLOT[(stage, phase)]
                block[at] = share.seconds
                block[at + 1] = share.cost_dollars
                check += share.seconds + share.cost_dollars
        causes: list[Any] = [NULL] * len(CAUSE_COLUMNS)
        extra: dict[str, dict[str, Any]] | None = None
        for key, tokens in r.miss_tokens.items():
            cause_slot = _CAUSE_SLOT.get(key)
            if cause_slot is None:
                extra = extra or {}
                extra.setdefault("miss_tokens", {})[key] = tokens
            else:
                causes[cause_slot] = tokens
        for key, dollars in r.miss_dollars.items():
            cause_slot = _CAUSE_SLOT.get(key)
            if cause_slot is None:
                extra = extra or {}
                extra.setdefault("miss_dollars", {})[key] = dollars
            else:
                causes[cause_slot + 1] = dollars
                check += dollars
        row: list[Any] = [r.record_id, trace_tag(r.record_id, r.trace_id)]
        row += [NULL if v is None else v for v in plain]
        for i in _BOOL_SLOTS:
            value = row[i]
            if value is not NULL:
                row[i] = int(value)
        ids = names.ids
        for text in _NAMES(r):
            row.append(NULL if text is None else (ids.get(text) or names.id_of(db, text)))
        for f in LIST_FIELDS:
            row.append(pack_list(getattr(r, f.name)))
        row += block
        row += causes
        row.append(None if extra is None else json.dumps(extra))
        if not math.isfinite(check):
            sanitize(row)
        return row


def sanitize(row: list[Any]) -> list[Any]:
    """Non-finite floats to 0 (None in an optional column), integers past 64 bits to
    REAL: what SQLite can hold. In place; also returns the row."""
    for i in _FLOAT_COLUMNS:
        value = row[i]
        if isinstance(value, float) and math.isinf(value):
            row[i] = NULL if i in _OPTIONAL_SLOTS else 0.0
    for i, value in enumerate(row):
        if type(value) is int and not -_INT_LIMIT <= value < _INT_LIMIT:
            row[i] = float(value)
    return row


# --- row -> record ----------------------------------------------------------------------------


def _plain_decoder(f: RF.RecordField) -> Callable[[Any], Any]:
    kind = f.kind
    if kind == RF.INT:
        return _as_int
    if kind == RF.OPT_INT:
        return lambda v: None if v is None else _as_int(v)
    if kind == RF.FLOAT:
        return lambda v: 0.0 if v is None else float(v)
    if kind == RF.OPT_FLOAT:
        return lambda v: None if v is None else float(v)
    if kind == RF.BOOL:
        return bool
    if kind == RF.OPT_BOOL:
        return lambda v: None if v is None else bool(v)
    return lambda v: v


def _as_int(value: Any) -> int:
    return value if type(value) is int else int(value or 0)


_PLAIN_DECODERS = tuple((f.name, COLUMN_INDEX[f.name], _plain_decoder(f)) for f in PLAIN_FIELDS)


class RowDecoder:
    """A row of :data:`COLUMNS` back to the RequestRecord it was written from."""

    def __init__(self, names: Names) -> None:
        self._names = names

    def decode(self, db: sqlite3.Connection, row: Sequence[Any]) -> RequestRecord:
        kwargs: dict[str, Any] = {name: convert(row[i]) for name, i, convert in _PLAIN_DECODERS}
        for f in NAME_FIELDS:
            kwargs[f.name] = self._names.text_of(db, row[COLUMN_INDEX[f.name]])
        if kwargs["model"] is None:
            kwargs["model"] = UNKNOWN
        if kwargs["status"] is None:
            kwargs["status"] = "ok"
        for f in LIST_FIELDS:
            kwargs[f.name] = unpack_list(row[COLUMN_INDEX[f.name]])
        stages: dict[Any, StageTiming] = {}
        for stage in STAGE_IDS:
            slot = _STAGE_OFFSET + _STAGE_SLOT[stage]
            rank = row[slot + 2]
            if rank is None:
                continue
            timing = StageTiming(stage, float(row[slot] or 0.0),
                                 PROVENANCE_OF_RANK.get(int(rank), Provenance.MODELED),
                                 float(row[slot + 1] or 0.0))
            for phase in PHASES:
                at = _PHASE_OFFSET + _PHASE_SLOT[(stage, phase)]
                seconds, dollars = row[at], row[at + 1]
                if seconds is not None or dollars is not None:
                    timing.phases[phase] = PhaseShare(float(seconds or 0.0),
                                                      float(dollars or 0.0))
            stages[stage] = timing
        miss_tokens: dict[str, int] = {}
        miss_dollars: dict[str, float] = {}
        for cause in CAUSES:
            at = _CAUSE_OFFSET + _CAUSE_SLOT[cause]
            if row[at] is not None:
                miss_tokens[cause] = _as_int(row[at])
            if row[at + 1] is not None:
                miss_dollars[cause] = float(row[at + 1])
        extra = row[COLUMN_INDEX["extra"]]
        if extra:
            data = json.loads(extra)
            miss_tokens.update({k: int(v or 0) for k, v in data.get("miss_tokens", {}).items()})
            miss_dollars.update({k: float(v or 0.0)
                                 for k, v in data.get("miss_dollars", {}).items()})
        record_id = str(row[0])
        return RequestRecord(trace_id=trace_of(record_id, row[1]), record_id=record_id,
                             stages=stages, miss_tokens=miss_tokens,
                             miss_dollars=miss_dollars, **kwargs)


def chunks(items: Iterable[Any], size: int) -> Iterable[list[Any]]:
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch
