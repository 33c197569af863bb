"""The query interface every view is written against: windows, named aggregate measures,
histograms and bounded samples. A store implements :class:`RecordQueries`
(collector/store/sqlite_sql.py for the embedded SQLite store); the views (tokenpath/views.py)
only combine what it returns, so another store (ClickHouse, say) gives the same views by
implementing the same measures.

**Measures** are named sums (a few are minimums or maximums: the ``min_``/``max_``
prefix) over the records of a window, optionally grouped. Names, per family:

- ``n``, ``complete_n``, ``simulated_n``, ``fingerprinted_n`` (records with prefix
  fingerprints), ``priced_n`` (records with attributed or naive dollars);
- ``input_tokens``, ``cache_read_tokens``, ``output_tokens`` and their sums of
  ``max(0, x)``: ``input_tokens_pos``, ``output_tokens_pos``;
- ``cost`` (attributed dollars), ``naive_cost``, ``waste`` (cache-miss waste dollars),
  ``energy`` (joules), ``energy_pos``, ``energy_measured_n`` and ``energy_other_n``
  (records whose energy provenance is ``measured``, or another non-empty one);
- ``prefill_seconds``, ``decode_seconds`` (None counts 0), ``response_chunks``,
  ``small_chunks``, ``response_bytes``, ``min_start`` (earliest start), ``max_end``;
- per stage ``x`` (a StageId value): ``st_n:x`` records with it, ``st_s:x`` seconds,
  ``st_c:x`` dollars, ``max_prov:x`` the weakest provenance's rank
  (tokenpath.stages.PROVENANCE_RANK); per stage and phase: ``ph_s:x:p`` seconds and
  ``ph_c:x:p`` dollars of the phase's shares (no value when no record has such a share);
  ``prefill_cost``: every record's prefill-phase dollars;
- per miss cause ``c`` (tokenpath.leaks.MissCause): ``mt:c`` tokens, ``md:c`` dollars;
- long context (``params.long_context_tokens``): ``lc_n``, ``lc_cost``,
  ``lc_prefill_s``, ``lc_prefill_c``; per context bucket ``i`` of
  tokenpath.leaks.CONTEXT_BUCKET_BOUNDS: ``cb_n:i``, ``cb_cost:i``, ``cb_prefill_s:i``,
  and the roofline's prefill terms (records of catalog models; grouped by model):
  ``cb_new:i`` new tokens, ``cb_q:i`` their ``n*c + n(n+1)/2`` attention term;
- last mile over the streamed records (tokenpath/last_mile.py): ``lm_streams``,
  ``lm_leaking`` (``params.packets_per_token_threshold``), ``lm_tokens``, ``lm_bytes``,
  ``lm_packets``, ``lm_resp_s``, ``lm_resp_c``, ``lm_tpot_sum``, ``lm_tpot_n``,
  ``lm_est_n`` (packets estimated from writes), ``lm_coal:N`` (segments at N tokens a
  write, N in tokenpath.last_mile.COALESCE_WHATIF_TOKENS and COALESCE_FIX_TOKENS);
- ``last_doubling``: the long-context requests' last doubling of prefill dollars
  (collector/cost/longcontext.py), with ``params.model_constants``;
- sets: ``set:models`` (the models seen), ``set:units`` (pricing units priced without a
  GPU inventory).

**Histograms** (``stage:x``, ``ttft``, ``tpot``) count values in log-spaced buckets:
bucket ``k`` holds ``(GAMMA**(k-1), GAMMA**k]`` with ``GAMMA = (1 + a) / (1 - a)``,
``a = QUANTILE_RELATIVE_ERROR``; 0 and negative values have buckets of their own.
:func:`quantile` reads a percentile off a histogram: the exact percentile interpolates
linearly between two order statistics, and the estimate interpolates, with the same
weights, between the representatives of the buckets that hold them. A representative is
within ``a`` (relative) of every value in its bucket, so the estimate is within ``a`` of
the exact percentile for values of one sign (plus float rounding at bucket edges).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tokenpath.leaks import CONTEXT_BUCKET_BOUNDS, LONG_CONTEXT_TOKENS, MissCause
from tokenpath.records import RequestRecord
from tokenpath.slo import MISS_STAGES, OUTCOMES
from tokenpath.stages import STAGE_IDS, Phase

QUANTILE_RELATIVE_ERROR = 0.01
GAMMA = (1 + QUANTILE_RELATIVE_ERROR) / (1 - QUANTILE_RELATIVE_ERROR)
LOG_GAMMA = math.log(GAMMA)
ZERO_KEY = -500_000  # the bucket of 0
NEGATIVE_BASE = -1_000_000  # a negative value v: NEGATIVE_BASE - key(-v)

DEFAULT_PACKETS_PER_TOKEN_THRESHOLD = 0.5  # tokenpath.last_mile's default
COALESCE_TOKENS: tuple[int, ...] = (4, 16)  # the what-if's and the fix's tokens a write


def bucket_key(value: float) -> int:
    """The histogram bucket of ``value`` (the stores compute the same in their query)."""
    if value > 0:
        return math.ceil(math.log(value) / LOG_GAMMA)
    if value < 0:
        return NEGATIVE_BASE - math.ceil(math.log(-value) / LOG_GAMMA)
    return ZERO_KEY


def bucket_value(key: int) -> float:
    """The value a bucket stands for: within QUANTILE_RELATIVE_ERROR of any it holds."""
    if key == ZERO_KEY:
        return 0.0
    if key <= NEGATIVE_BASE // 2:
        return -bucket_value(NEGATIVE_BASE - key)
    return 2.0 * GAMMA ** key / (1.0 + GAMMA)


def quantile(histogram: Mapping[int, int], q: float) -> float | None:
    """The ``q`` percentile (0..1) of the values counted in ``histogram`` (bucket ->
    count), interpolated linearly between order statistics (as the exact percentile of
    testkit/oracles/report.py); None for none."""
    total = sum(histogram.values())
    if total <= 0:
        return None
    pos = q * (total - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, total - 1)
    lo_value = hi_value = None
    seen = 0
    for key in sorted(histogram):
        count = histogram[key]
        if count <= 0:
            continue
        if lo_value is None and lo < seen + count:
            lo_value = bucket_value(key)
        if hi < seen + count:
            hi_value = bucket_value(key)
            break
        seen += count
    assert lo_value is not None and hi_value is not None
    return lo_value + (hi_value - lo_value) * (pos - lo)


# --- measure names ---------------------------------------------------------------------------

STAGE_VALUES: tuple[str, ...] = tuple(s.value for s in STAGE_IDS)
PHASE_VALUES: tuple[str, ...] = tuple(p.value for p in Phase)
CAUSE_VALUES: tuple[str, ...] = tuple(c.value for c in MissCause)
CONTEXT_BUCKETS: int = len(CONTEXT_BUCKET_BOUNDS) + 1

CORE = ("n", "complete_n", "simulated_n", "fingerprinted_n", "priced_n", "input_tokens",
        "cache_read_tokens", "output_tokens", "input_tokens_pos", "output_tokens_pos", "cost",
        "naive_cost", "waste", "energy", "energy_pos", "energy_measured_n", "energy_other_n",
        "prefill_seconds", "decode_seconds", "response_chunks", "small_chunks",
        "response_bytes", "min_start", "max_end", "prefill_cost")
STAGE_MEASURES = tuple(
    f"{kind}:{s}" for s in STAGE_VALUES for kind in ("st_n", "st_s", "st_c", "max_prov"))
PHASE_MEASURES = tuple(f"{kind}:{s}:{p}" for s in STAGE_VALUES for p in PHASE_VALUES
                       for kind in ("ph_s", "ph_c"))
CAUSE_MEASURES = tuple(f"{kind}:{c}" for c in CAUSE_VALUES for kind in ("mt", "md"))
LONG_CONTEXT = ("lc_n", "lc_cost", "lc_prefill_s", "lc_prefill_c")
CONTEXT_BUCKET_MEASURES = tuple(
    f"{kind}:{i}" for i in range(CONTEXT_BUCKETS)
    for kind in ("cb_n", "cb_cost", "cb_prefill_s", "cb_new", "cb_q"))
LAST_MILE = ("lm_streams", "lm_leaking", "lm_tokens", "lm_bytes", "lm_packets", "lm_resp_s",
             "lm_resp_c", "lm_tpot_sum", "lm_tpot_n", "lm_est_n",
             *(f"lm_coal:{n}" for n in COALESCE_TOKENS))
SETS = ("set:models", "set:units", "set:unit_gpus")
ALL_MEASURES = (*CORE, *STAGE_MEASURES, *PHASE_MEASURES, *CAUSE_MEASURES, *LONG_CONTEXT,
                *CONTEXT_BUCKET_MEASURES, *LAST_MILE, "last_doubling")
HISTOGRAMS = (*(f"stage:{s}" for s in STAGE_VALUES), "ttft", "tpot")
# SLO classes (tokenpath/slo.py): requests and dollars by outcome, and the missed ones by
# dominant stage. Read from ``records`` (no rollup holds them); grouped by ``slo`` for the
# classes. ``set:unit_gpus``: the pricing units seen, each with its GPUs
# (tokenpath.slo.unit_gpus_item).
SLO_MEASURES = (*(f"slo_{kind}:{o}" for o in OUTCOMES for kind in ("n", "c")),
                *(f"slo_{kind}:{s}" for s in MISS_STAGES for kind in ("ms", "mc")))
SLO_GROUP = "slo"


def combine(name: str, a: float, b: float) -> float:
    """Two partial values of measure ``name`` as one (sums add)."""
    if name.startswith("min_"):
        return min(a, b)
    if name.startswith("max_"):
        return max(a, b)
    return a + b


@dataclass(frozen=True, slots=True)
class Params:
    """What parameterized measures take; the defaults are what stores may pre-aggregate."""

    long_context_tokens: int = LONG_CONTEXT_TOKENS
    packets_per_token_threshold: float = DEFAULT_PACKETS_PER_TOKEN_THRESHOLD
    # last_doubling: per served model name, (2 x params, 4 x layers x attention dim) of
    # its catalog roofline (collector/cost/longcontext.py); other models count half.
    model_constants: tuple[tuple[str, float, float], ...] = ()


DEFAULT_PARAMS = Params()


@dataclass(frozen=True, slots=True)
class Window:
    """Records that ended at or after ``since_unix`` and at or before ``until_unix``."""

    since_unix: float | None = None
    until_unix: float | None = None


@dataclass(frozen=True, slots=True)
class TimeBuckets:
    """Group by end time: ``count`` buckets of ``width`` seconds from ``start_unix`` (the
    last bucket also takes what ends past it)."""

    start_unix: float
    width: float
    count: int


GroupBy = str | TimeBuckets | None  # None, "tenant", "model", "pool", "slo" or time buckets


@dataclass(slots=True)
class Aggregates:
    """Measures, histograms and sets over one group of records."""

    values: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, dict[int, int]] = field(default_factory=dict)
    sets: dict[str, set[str]] = field(default_factory=dict)

    def __getitem__(self, name: str) -> float:
        return self.values.get(name, 0.0)

    def get(self, name: str) -> float | None:
        """None when no record gave the measure a value (a min or max over none)."""
        return self.values.get(name)

    def count(self, name: str) -> int:
        return int(self.values.get(name, 0))

    def histogram(self, name: str) -> dict[int, int]:
        return self.histograms.get(name, {})

    def set(self, name: str) -> set[str]:
        return self.sets.get(name, set())

    def merge(self, other: Aggregates) -> Aggregates:
        for name, value in other.values.items():
            mine = self.values.get(name)
            self.values[name] = value if mine is None else combine(name, mine, value)
        for name, hist in other.histograms.items():
            into = self.histograms.setdefault(name, {})
            for key, count in hist.items():
                into[key] = into.get(key, 0) + count
        for name, items in other.sets.items():
            self.sets.setdefault(name, set()).update(items)
        return self


@dataclass(frozen=True, slots=True)
class Coverage:
    """What a store holds: how long it keeps records and the oldest it has."""

    retention_seconds: float | None
    oldest_end_unix: float | None
    now_unix: float | None = None  # the store's clock; the wall clock when None

    def note(self, window: Window, now: float | None = None) -> str | None:
        """A sentence when ``window`` reaches back past what the store keeps."""
        if window.since_unix is None or self.retention_seconds is None:
            return None
        if now is None:
            now = time.time() if self.now_unix is None else self.now_unix
        if window.since_unix >= now - self.retention_seconds:
            return None
        asked = (now - window.since_unix) / 3600
        kept = self.retention_seconds / 3600
        return (f"the window asks for {asked:,.4g} h but the store keeps {kept:,.4g} h "
                "(store.retention_seconds): the figures cover the retained part only")

    def to_json(self, window: Window) -> dict[str, Any]:
        return {"since_unix": window.since_unix, "until_unix": window.until_unix,
                "retention_seconds": self.retention_seconds,
                "oldest_record_end_unix": self.oldest_end_unix,
                "note": self.note(window)}


@dataclass(frozen=True, slots=True)
class Sample:
    """A bounded sample of a window's records, and what it was taken from."""

    records: list[RequestRecord]
    of: int  # the window's records
    limit: int

    def to_json(self) -> dict[str, Any]:
        return {"records": len(self.records), "of": self.of, "limit": self.limit,
                "which": "the newest records of the window"}


class RecordQueries(Protocol):
    """The read interface: what every view (tokenpath/views.py) asks, answered by the
    SQLite and ClickHouse stores (collector/store/) and by the remote reader over
    collectors (tokenpath/cli/remote.py). Aggregates cross into Python; records only in
    bounded lists.

    Thread contract: every method may be called from any thread, at once. An aggregate
    counts each record at most once (a batch the writer commits while it is read is
    counted or not yet, never twice); two calls may see two states of the records."""

    def aggregate(self, window: Window, measures: Sequence[str],
                  histograms: Sequence[str] = (), group_by: GroupBy = None,
                  params: Params = DEFAULT_PARAMS) -> dict[Any, Aggregates]:
        """Measures (names above) over the window's records, by group (the key None
        without ``group_by``; a group's name, or a time bucket's index). Groups with no
        records are absent."""
        ...

    def end_range(self, window: Window) -> tuple[float, float] | None:
        """The earliest and latest end time in the window; None when it has none."""
        ...

    def sample(self, window: Window, limit: int,
               fingerprinted: bool = False) -> Sample:
        """The newest ``limit`` records of the window (only those with prefix
        fingerprints when ``fingerprinted``), oldest first."""
        ...

    def records(self, limit: int | None = None, since_unix: float | None = None,
                until_unix: float | None = None) -> list[RequestRecord]:
        ...

    def idle_cost_dollars(self, since_unix: float | None = None) -> float:
        ...

    def idle_energy_joules(self, since_unix: float | None = None) -> float:
        ...

    def coverage(self) -> Coverage:
        ...


def merge_groups(parts: Iterable[dict[Any, Aggregates]]) -> dict[Any, Aggregates]:
    out: dict[Any, Aggregates] = {}
    for part in parts:
        for key, aggregates in part.items():
            mine = out.get(key)
            if mine is None:
                out[key] = Aggregates().merge(aggregates)
            else:
                mine.merge(aggregates)
    return out
