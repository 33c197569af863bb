"""SLO classes: which latency objective a request is held to, whether it met it, and what
the requests within and outside their objectives cost.

A class names its targets (time to first token, time per output token, end-to-end time;
any it leaves out is not checked), its objective (the share of requests that must meet
them, e.g. 0.99) and the requests it applies to (``match``: tenant, model, span
attributes; all must hold). Classes are tried in order and the first that matches wins; a
class with no ``match`` takes every request that reaches it, so it comes last. A request
no class takes is in the class ``default`` with no targets.

A record's outcome is ``met`` when every target of its class holds, ``missed`` when any
does not, and ``unknown`` when a measure one of its targets needs is absent (no TTFT on
the record, a single output token for TPOT) and none of those present is missed, or when
its class has no targets. ``unknown`` requests are counted and priced apart; they are
neither good nor bad: goodput counts ``met`` only, and the burn-rate alerts' error ratio is
missed / (met + missed).

A missed request's dominant stage says where its time went, among the stages that make
up the measure it missed (the first of TTFT, TPOT, end-to-end): ``queue`` (scheduler
queue), ``prefill``, ``decode`` or ``network`` (the network stages and the response
path). TTFT is queue, prefill and network; TPOT decode and network; end-to-end all four.

A record joined to its client hop (collector/call_join.py: its TTFT and duration become
the client's) keeps its class and is judged again.

Records are classified where traces are mapped (collector/mapping.py), so each replica of
a sharded deployment must run the same classes: :meth:`SloConfig.digest` names them, and
the collector exports it (``tokenpath_slo_config_info{digest}``).

This module is plain data and arithmetic: no Prometheus, no store.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from tokenpath.config import ConfigError, check, validate_fields
from tokenpath.records import RequestRecord
from tokenpath.stages import NETWORK_STAGES, StageId

CONFIG_KEY: Final = "slo_classes"
OUTCOME_MET: Final = "met"
OUTCOME_MISSED: Final = "missed"
OUTCOME_UNKNOWN: Final = "unknown"
OUTCOMES: Final[tuple[str, ...]] = (OUTCOME_MET, OUTCOME_MISSED, OUTCOME_UNKNOWN)
DEFAULT_CLASS: Final = "default"
DEFAULT_OBJECTIVE: Final = 0.99

MATCH_TENANT: Final = "tenant"
MATCH_MODEL: Final = "model"
MATCH_ATTRIBUTE: Final = "attribute"
MATCH_KEYS: Final[tuple[str, ...]] = (MATCH_TENANT, MATCH_MODEL, MATCH_ATTRIBUTE)
TARGET_KEYS: Final[tuple[str, ...]] = ("ttft_seconds", "tpot_seconds", "e2e_seconds")
CLASS_KEYS: Final[tuple[str, ...]] = ("name", "match", *TARGET_KEYS, "objective")

# Where a missed request's time went (its dominant stage).
STAGE_QUEUE: Final = "queue"
STAGE_PREFILL: Final = "prefill"
STAGE_DECODE: Final = "decode"
STAGE_NETWORK: Final = "network"
MISS_STAGES: Final[tuple[str, ...]] = (STAGE_QUEUE, STAGE_PREFILL, STAGE_DECODE,
                                       STAGE_NETWORK)
# The stages each measure is made of, in the order ties are broken.
_TTFT_STAGES: Final = (STAGE_QUEUE, STAGE_PREFILL, STAGE_NETWORK)
_TPOT_STAGES: Final = (STAGE_DECODE, STAGE_NETWORK)
_NETWORK_PATH: Final[tuple[StageId, ...]] = (*NETWORK_STAGES, StageId.RESPONSE_PATH)

# A target (ttft_seconds, tpot_seconds, e2e_seconds): None, or seconds above 0.
_TARGET: Final = check(finite=True, gt=0, optional=True,
                       message="must be a number of seconds above 0, not {value!r}")


@dataclass(frozen=True, slots=True)
class SloClass:
    """One class: its targets (None: not checked), objective and what it matches."""

    name: str = field(metadata=check(non_empty=True, message="must be a non-empty string"))
    ttft_seconds: float | None = field(default=None, metadata=_TARGET)
    tpot_seconds: float | None = field(default=None, metadata=_TARGET)
    e2e_seconds: float | None = field(default=None, metadata=_TARGET)
    objective: float = field(default=DEFAULT_OBJECTIVE, metadata=check(
        gt=0.0, lt=1.0, message="must be between 0 and 1 (exclusive), not {value!r}"))
    tenant: str | None = None
    model: str | None = None
    attributes: tuple[tuple[str, str], ...] = ()

    @property
    def matches_all(self) -> bool:
        return self.tenant is None and self.model is None and not self.attributes

    @property
    def has_targets(self) -> bool:
        return not (self.ttft_seconds is None and self.tpot_seconds is None
                    and self.e2e_seconds is None)

    def matches(self, tenant: str | None, model: str,
                attribute: Callable[[str], str | None]) -> bool:
        if self.tenant is not None and tenant != self.tenant:
            return False
        if self.model is not None and model != self.model:
            return False
        return all(attribute(key) == value for key, value in self.attributes)

    def outcome(self, ttft: float | None, tpot: float | None, e2e: float | None) -> str:
        """``met``, ``missed`` or ``unknown`` (see the module's docstring)."""
        if not self.has_targets:
            return OUTCOME_UNKNOWN
        absent = False
        for target, value in ((self.ttft_seconds, ttft), (self.tpot_seconds, tpot),
                              (self.e2e_seconds, e2e)):
            if target is None:
                continue
            if value is None:
                absent = True
            elif value > target:
                return OUTCOME_MISSED
        return OUTCOME_UNKNOWN if absent else OUTCOME_MET

    def missed_measure(self, ttft: float | None, tpot: float | None,
                       e2e: float | None) -> str | None:
        """The first measure over its target: ``ttft``, ``tpot`` or ``e2e``."""
        for name, target, value in (("ttft", self.ttft_seconds, ttft),
                                    ("tpot", self.tpot_seconds, tpot),
                                    ("e2e", self.e2e_seconds, e2e)):
            if target is not None and value is not None and value > target:
                return name
        return None

    def validate(self, key: str) -> None:
        validate_fields(self, key)
        if not self.has_targets:
            raise ConfigError(key, f"names no target: give at least one of "
                                   f"{', '.join(TARGET_KEYS)}")

    def to_json(self) -> dict[str, Any]:
        match: dict[str, Any] = {}
        if self.tenant is not None:
            match[MATCH_TENANT] = self.tenant
        if self.model is not None:
            match[MATCH_MODEL] = self.model
        if self.attributes:
            match[MATCH_ATTRIBUTE] = dict(self.attributes)
        return {"name": self.name, "match": match, "ttft_seconds": self.ttft_seconds,
                "tpot_seconds": self.tpot_seconds, "e2e_seconds": self.e2e_seconds,
                "objective": self.objective}


IMPLICIT_DEFAULT: Final = SloClass(DEFAULT_CLASS)


@dataclass(frozen=True, slots=True)
class SloConfig:
    """The collector's ``slo_classes``; none configured: records carry no class."""

    classes: tuple[SloClass, ...] = ()

    @property
    def enabled(self) -> bool:
        return bool(self.classes)

    def validate(self) -> None:
        seen: set[str] = set()
        for i, cls in enumerate(self.classes):
            key = f"{CONFIG_KEY}[{i}]"
            cls.validate(key)
            if cls.name in seen:
                raise ConfigError(f"{key}.name", f"class {cls.name!r} is named twice")
            seen.add(cls.name)
            if cls.matches_all and i != len(self.classes) - 1:
                raise ConfigError(f"{key}.match", "a class with no match takes every request "
                                  "that reaches it: it must be the last class")

    def by_name(self, name: str | None) -> SloClass | None:
        for cls in self.classes:
            if cls.name == name:
                return cls
        return IMPLICIT_DEFAULT if name == DEFAULT_CLASS else None

    def names(self) -> tuple[str, ...]:
        """Every class a record can be in (the implicit default among them)."""
        names = tuple(c.name for c in self.classes)
        if self.classes and not self.classes[-1].matches_all and DEFAULT_CLASS not in names:
            names += (DEFAULT_CLASS,)
        return names

    def classify(self, tenant: str | None, model: str,
                 attribute: Callable[[str], str | None]) -> SloClass:
        for cls in self.classes:
            if cls.matches(tenant, model, attribute):
                return cls
        return self.by_name(DEFAULT_CLASS) or IMPLICIT_DEFAULT

    def digest(self) -> str:
        """A short hash of the classes as configured (order included): replicas that
        classify alike show the same digest."""
        text = json.dumps([c.to_json() for c in self.classes], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @classmethod
    def from_file(cls, raw: Any) -> SloConfig:
        """``slo_classes`` as a config file gives it (a list of mappings)."""
        if raw is None:
            return cls()
        if not isinstance(raw, list):
            raise ConfigError(CONFIG_KEY, "must be a list of classes")
        config = cls(tuple(_parse_class(f"{CONFIG_KEY}[{i}]", item)
                           for i, item in enumerate(raw)))
        config.validate()
        return config


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(key, f"must be a number, not {value!r}")
    return float(value)


def _text(key: str, value: Any) -> str:
    if not isinstance(value, str | int | float) or isinstance(value, bool) or value == "":
        raise ConfigError(key, f"must be a non-empty string, not {value!r}")
    return str(value)


def _parse_class(key: str, item: Any) -> SloClass:
    if not isinstance(item, dict):
        raise ConfigError(key, "must be a mapping")
    for name in item:
        if name not in CLASS_KEYS:
            raise ConfigError(f"{key}.{name}", f"unknown key; known: {', '.join(CLASS_KEYS)}")
    if "name" not in item:
        raise ConfigError(f"{key}.name", "is required")
    name = _text(f"{key}.name", item["name"])
    targets = {t: (None if item.get(t) is None else _number(f"{key}.{t}", item[t]))
               for t in TARGET_KEYS}
    objective = (DEFAULT_OBJECTIVE if item.get("objective") is None
                 else _number(f"{key}.objective", item["objective"]))
    match = item.get("match") or {}
    if not isinstance(match, dict):
        raise ConfigError(f"{key}.match", "must be a mapping")
    for match_key in match:
        if match_key not in MATCH_KEYS:
            raise ConfigError(f"{key}.match.{match_key}",
                              f"unknown matcher; known: {', '.join(MATCH_KEYS)}")
    tenant = match.get(MATCH_TENANT)
    model = match.get(MATCH_MODEL)
    attributes = match.get(MATCH_ATTRIBUTE) or {}
    if not isinstance(attributes, dict):
        raise ConfigError(f"{key}.match.{MATCH_ATTRIBUTE}",
                          "must map span attribute names to values")
    return SloClass(
        name=name, objective=objective,
        tenant=None if tenant is None else _text(f"{key}.match.{MATCH_TENANT}", tenant),
        model=None if model is None else _text(f"{key}.match.{MATCH_MODEL}", model),
        attributes=tuple(
            (_text(f"{key}.match.{MATCH_ATTRIBUTE}", k),
             _text(f"{key}.match.{MATCH_ATTRIBUTE}.{k}", v)) for k, v in attributes.items()),
        **targets)


# --- a record's dominant stage ------------------------------------------------------------------


def dominant_stage(measure: str, seconds: Mapping[str, float]) -> str | None:
    """The stage (of MISS_STAGES) with the most of ``seconds`` among those ``measure``
    (``ttft``, ``tpot``, ``e2e``) is made of; None when none took any time."""
    candidates = (_TTFT_STAGES if measure == "ttft" else _TPOT_STAGES if measure == "tpot"
                  else MISS_STAGES)
    best: str | None = None
    most = 0.0
    for stage in candidates:
        value = seconds.get(stage, 0.0)
        if value > most:
            best, most = stage, value
    return best


# --- what a window's classes cost ---------------------------------------------------------------


@dataclass(slots=True)
class SloClassSummary:
    """One class over a window: requests and dollars by outcome, and what they give."""

    slo: str
    objective: float | None = None
    requests: dict[str, int] = field(default_factory=dict)  # outcome -> requests
    dollars: dict[str, float] = field(default_factory=dict)  # outcome -> cost_dollars
    # Missed requests and their dollars by dominant stage (MISS_STAGES; "" for none).
    missed_by_stage: dict[str, int] = field(default_factory=dict)
    missed_dollars_by_stage: dict[str, float] = field(default_factory=dict)

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())

    @property
    def total_dollars(self) -> float:
        return sum(self.dollars.values())

    @property
    def met(self) -> int:
        return self.requests.get(OUTCOME_MET, 0)

    @property
    def missed_dollars(self) -> float:
        return self.dollars.get(OUTCOME_MISSED, 0.0)

    @property
    def attainment(self) -> float | None:
        """met / (met + missed): the share the objective is held against."""
        judged = self.met + self.requests.get(OUTCOME_MISSED, 0)
        return self.met / judged if judged else None

    @property
    def dollars_per_good_request(self) -> float | None:
        """Every dollar the class spent (met, missed, unknown) over its met requests:
        what a request within its SLO really costs."""
        return self.total_dollars / self.met if self.met else None

    def add(self, outcome: str, requests: int, dollars: float) -> None:
        self.requests[outcome] = self.requests.get(outcome, 0) + requests
        self.dollars[outcome] = self.dollars.get(outcome, 0.0) + dollars

    def to_json(self, window_seconds: float, gpus: int) -> dict[str, Any]:
        goodput = self.met / window_seconds if window_seconds > 0 else None
        return {
            "slo": self.slo,
            "objective": self.objective,
            "requests": self.total_requests,
            "met": self.met,
            "missed": self.requests.get(OUTCOME_MISSED, 0),
            "unknown": self.requests.get(OUTCOME_UNKNOWN, 0),
            "attainment": self.attainment,
            "cost_dollars": self.total_dollars,
            "met_dollars": self.dollars.get(OUTCOME_MET, 0.0),
            "missed_dollars": self.missed_dollars,
            "unknown_dollars": self.dollars.get(OUTCOME_UNKNOWN, 0.0),
            "goodput_requests_per_second": goodput,
            "goodput_per_gpu": goodput / gpus if goodput is not None and gpus else None,
            "dollars_per_good_request": self.dollars_per_good_request,
            "missed_by_stage": dict(self.missed_by_stage),
            "missed_dollars_by_stage": dict(self.missed_dollars_by_stage),
        }


@dataclass(slots=True)
class SloSummary:
    """Every class over a window, and the totals: goodput (met requests per second),
    goodput per GPU (over the GPUs billed in the window) and dollars per good request."""

    classes: list[SloClassSummary]
    window_seconds: float
    gpus: int  # GPUs of the engines that served the window's requests

    def total(self) -> SloClassSummary:
        out = SloClassSummary("")
        for cls in self.classes:
            for outcome, n in cls.requests.items():
                out.add(outcome, n, cls.dollars.get(outcome, 0.0))
            for stage, n in cls.missed_by_stage.items():
                out.missed_by_stage[stage] = out.missed_by_stage.get(stage, 0) + n
            for stage, d in cls.missed_dollars_by_stage.items():
                out.missed_dollars_by_stage[stage] = \
                    out.missed_dollars_by_stage.get(stage, 0.0) + d
        return out

    def to_json(self) -> dict[str, Any]:
        total = self.total().to_json(self.window_seconds, self.gpus)
        total.pop("slo")
        total.pop("objective")
        return {**total, "window_seconds": self.window_seconds, "gpus_billed": self.gpus,
                "classes": [c.to_json(self.window_seconds, self.gpus)
                            for c in self.classes]}


def gpus_billed(unit_gpus: Mapping[str, int]) -> int:
    """The GPUs of the engines seen: each engine's largest tensor-parallel size."""
    return sum(max(0, n) for n in unit_gpus.values())


UNIT_GPUS_SEPARATOR: Final = "\x1f"


def unit_gpus_item(node: str | None, engine_id: str | None, gpus: int) -> str:
    """One member of the ``set:unit_gpus`` set: an engine (on its node) and its GPUs."""
    return f"{node or ''}/{engine_id or ''}{UNIT_GPUS_SEPARATOR}{int(gpus)}"


def parse_unit_gpus(items: set[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        unit, _, gpus = item.rpartition(UNIT_GPUS_SEPARATOR)
        try:
            n = int(gpus)
        except ValueError:
            continue
        out[unit] = max(out.get(unit, 0), n)
    return out


# --- classifying a record -----------------------------------------------------------------------


def stage_seconds(record: RequestRecord) -> dict[str, float]:
    """A record's seconds in each of MISS_STAGES."""
    queue = record.queue_seconds
    if queue is None:
        timing = record.stages.get(StageId.SCHEDULER_QUEUE)
        queue = timing.seconds if timing is not None else 0.0
    network = 0.0
    for stage in _NETWORK_PATH:
        timing = record.stages.get(stage)
        if timing is not None:
            network += timing.seconds
    return {STAGE_QUEUE: queue, STAGE_PREFILL: record.prefill_seconds or 0.0,
            STAGE_DECODE: record.decode_seconds or 0.0, STAGE_NETWORK: network}


def classify_record(record: RequestRecord, config: SloConfig,
                    attribute: Callable[[str], str | None]) -> None:
    """Set the record's ``slo``, ``slo_outcome`` and (missed) ``slo_miss_stage``;
    ``attribute`` reads a span attribute of its trace."""
    cls = config.classify(record.tenant, record.model, attribute)
    record.slo = cls.name
    _judge(record, cls)


def judge_record(record: RequestRecord, config: SloConfig) -> None:
    """Judge the record again against its class's targets (its TTFT, TPOT or duration
    changed since it was classified: a client hop joined to it); the class stays."""
    cls = config.by_name(record.slo)
    if cls is not None:
        _judge(record, cls)


def _judge(record: RequestRecord, cls: SloClass) -> None:
    ttft, tpot = record.ttft_seconds, record.tpot_seconds
    e2e = record.duration_seconds
    record.slo_outcome = cls.outcome(ttft, tpot, e2e)
    record.slo_miss_stage = None
    if record.slo_outcome == OUTCOME_MISSED:
        measure = cls.missed_measure(ttft, tpot, e2e)
        if measure is not None:
            record.slo_miss_stage = dominant_stage(measure, stage_seconds(record))


# --- summaries ----------------------------------------------------------------------------------


def summary_from_counts(by_class: Mapping[str | None, Mapping[str, float]],
                        window_seconds: float, unit_gpus: set[str],
                        config: SloConfig | None = None) -> SloSummary | None:
    """The window's SloSummary from per-class measures (tokenpath.query.SLO_MEASURES,
    grouped by class; None: records with no class, left out); None when no record has one."""
    classes = []
    for name in sorted(k for k in by_class if k is not None):
        values = by_class[name]
        cls = config.by_name(name) if config is not None else None
        summary = SloClassSummary(name, cls.objective if cls is not None and
                                  cls.has_targets else None)
        for outcome in OUTCOMES:
            n = int(values.get(f"slo_n:{outcome}", 0))
            if n:
                summary.add(outcome, n, float(values.get(f"slo_c:{outcome}", 0.0)))
        for stage in MISS_STAGES:
            n = int(values.get(f"slo_ms:{stage}", 0))
            if n:
                summary.missed_by_stage[stage] = n
                summary.missed_dollars_by_stage[stage] = float(
                    values.get(f"slo_mc:{stage}", 0.0))
        if summary.total_requests:
            classes.append(summary)
    if not classes:
        return None
    return SloSummary(classes, window_seconds, gpus_billed(parse_unit_gpus(unit_gpus)))


def scaled(config: SloConfig, factor: float) -> SloConfig:
    """The classes with every target times ``factor`` (the demo's engine runs on a scaled
    clock: its targets scale with it)."""
    def times(value: float | None) -> float | None:
        return None if value is None else value * factor

    return SloConfig(tuple(
        SloClass(c.name, times(c.ttft_seconds), times(c.tpot_seconds), times(c.e2e_seconds),
                 c.objective, c.tenant, c.model, c.attributes) for c in config.classes))
