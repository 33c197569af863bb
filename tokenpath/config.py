"""Config plumbing shared by every component: errors that name the key, and precedence.

Each component has its own dataclass with named default constants and a ``validate()``
that raises :class:`ConfigError` naming the offending key. A field's own constraints are
declared on the field, ``x: int = field(default=1, metadata=check(ge=1))``, and one
function, :func:`validate_fields`, checks them all (errors name ``section.x``); a
``validate()`` is that call plus the rules that relate two fields, written by hand.
Values resolve in the order argument > environment > file > default (:func:`resolve`,
:func:`resolve_typed`).

One rule for values, in every component (:func:`typed_value`): a file value must have its
setting's YAML type (an integer setting takes ``5``, not ``"5"``, ``5.0`` or ``true``; a
boolean ``true``/``false``; a number a finite number); a duration takes a number of
seconds or a string such as ``30s``, ``5m``, ``2h``, ``1d``; an environment variable or
command-line value is text, parsed by the same rule. File keys name the setting; a
duration's ends in ``_seconds``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value is missing or wrong; ``key`` names it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


# The key of a field's :class:`Check` in its ``dataclasses.field`` metadata.
CHECK_METADATA_KEY: Final = "tokenpath.config.check"


def _number_text(bound: float) -> str:
    """A bound as a message spells it: ``1`` for 1 and 1.0, ``0.05`` for 0.05."""
    return str(int(bound)) if float(bound).is_integer() else repr(bound)


@dataclass(frozen=True, slots=True)
class Check:
    """One field's constraints, as :func:`check` declares them (see there)."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    integer: bool = False
    finite: bool = False
    boolean: bool = False
    one_of: tuple[Any, ...] | None = None
    non_empty: bool = False
    min_length: int | None = None
    max_length: int | None = None
    optional: bool = False
    key: str | None = None
    message: str | None = None

    def __post_init__(self) -> None:
        if self.ge is not None and self.gt is not None:
            raise ValueError("check: give ge or gt, not both")
        if self.le is not None and self.lt is not None:
            raise ValueError("check: give le or lt, not both")

    @property
    def bounded(self) -> bool:
        return (self.ge is not None or self.gt is not None or self.le is not None
                or self.lt is not None)

    def describe(self) -> str:
        """What the rule asks, as an error says it: ``must be >= 1``, ``must be an integer
        > 0``, ``must be a finite number > 0``, ``must be between 0 and 1``, ``must be one of
        a, b``, ``must not be empty``, ``must be true or false``."""
        if self.message is not None:
            return self.message
        if self.boolean:
            return "must be true or false"
        if self.one_of is not None:
            return f"must be one of {', '.join(str(choice) for choice in self.one_of)}"
        parts: list[str] = []
        if self.non_empty:
            parts.append("must not be empty")
        if self.min_length is not None:
            parts.append(f"must be at least {self.min_length} characters")
        if self.max_length is not None:
            parts.append(f"must be at most {self.max_length} characters")
        if self.integer or self.finite or self.bounded:
            noun = "an integer" if self.integer else "a finite number" if self.finite else ""
            low = (f">= {_number_text(self.ge)}" if self.ge is not None
                   else f"> {_number_text(self.gt)}" if self.gt is not None else "")
            high = (f"<= {_number_text(self.le)}" if self.le is not None
                    else f"< {_number_text(self.lt)}" if self.lt is not None else "")
            if self.ge is not None and self.le is not None:
                bounds = f"between {_number_text(self.ge)} and {_number_text(self.le)}"
            else:
                bounds = " and ".join(part for part in (low, high) if part)
            parts.append("must be " + " ".join(part for part in (noun, bounds) if part))
        return "; ".join(parts)

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` meets every rule. A bound fails on NaN (``not value >= ge``);
        ``None`` passes only an ``optional`` field."""
        if value is None:
            return self.optional
        if self.boolean:
            return isinstance(value, bool)
        if self.one_of is not None and value not in self.one_of:
            return False
        if self.non_empty and not value:
            return False
        if self.min_length is not None and len(value) < self.min_length:
            return False
        if self.max_length is not None and len(value) > self.max_length:
            return False
        if self.integer and (isinstance(value, bool) or not isinstance(value, int)):
            return False
        if self.finite and (isinstance(value, bool) or not isinstance(value, int | float)
                            or not math.isfinite(value)):
            return False
        if self.ge is not None and not value >= self.ge:
            return False
        if self.gt is not None and not value > self.gt:
            return False
        if self.le is not None and not value <= self.le:
            return False
        return not (self.lt is not None and not value < self.lt)

    def problem(self, value: Any) -> str | None:
        """The error message for ``value`` (``{value!r}`` in a given ``message`` is
        filled in), or ``None`` when it is accepted."""
        if self.accepts(value):
            return None
        return self.describe().format(value=value)


def check(*, ge: float | None = None, gt: float | None = None, le: float | None = None,
          lt: float | None = None, integer: bool = False, finite: bool = False,
          boolean: bool = False, one_of: tuple[Any, ...] | None = None,
          non_empty: bool = False, min_length: int | None = None,
          max_length: int | None = None, optional: bool = False, key: str | None = None,
          message: str | None = None) -> Mapping[str, Any]:
    """A field's constraints as ``dataclasses.field`` metadata, checked by
    :func:`validate_fields`::

        max_traces: int = field(default=DEFAULT_MAX_TRACES, metadata=check(ge=1))

    ``ge``/``gt``/``le``/``lt``: bounds (NaN fails each); ``integer``: an ``int``, not a
    ``bool``; ``finite``: a finite number; ``boolean``: ``True`` or ``False``; ``one_of``:
    one of these values; ``non_empty``: not empty; ``min_length``/``max_length``: at
    least/at most this long (``len``);
    ``optional``: ``None`` passes (else it fails). ``key``: the name errors give, in place
    of the field's (``http`` for ``http_port``); ``message``: the error's text in place of
    the one the rules give (``{value!r}`` is filled in).

    ``dataclasses.field`` itself takes the metadata so that the field keeps its type (and
    a compiled module, whose mypyc treats ``field()`` calls specially, keeps working)."""
    return MappingProxyType({CHECK_METADATA_KEY: Check(
        ge=ge, gt=gt, le=le, lt=lt, integer=integer, finite=finite, boolean=boolean,
        one_of=None if one_of is None else tuple(one_of), non_empty=non_empty,
        min_length=min_length, max_length=max_length, optional=optional, key=key, message=message)})


# The rule most counts share, in the words the reference path's errors use.
AT_LEAST_ONE: Final = check(ge=1, message="must be at least 1")


def field_checks(config_class: Any) -> list[tuple[str, Check]]:
    """The checked fields of a config dataclass (class or instance), in declaration
    order: (field name, its :class:`Check`)."""
    return [(f.name, f.metadata[CHECK_METADATA_KEY]) for f in dataclasses.fields(config_class)
            if CHECK_METADATA_KEY in f.metadata]


def validate_fields(config: Any, section: str = "") -> None:
    """Checks every field of the ``config`` dataclass declared with :func:`check`, in
    declaration order; the first that fails raises :class:`ConfigError` naming
    ``section.key`` (``key`` alone with no section)."""
    for name, rule in field_checks(config):
        message = rule.problem(getattr(config, name))
        if message is not None:
            key = rule.key if rule.key is not None else name
            raise ConfigError(f"{section}.{key}" if section else key, message)


def load_config_file(path: str | Path | None) -> dict[str, Any]:
    """A YAML mapping from ``path``, or ``{}`` when no path is given."""
    if path is None:
        return {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("config", f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("config", f"{path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("config", f"{path} must hold a mapping at the top level")
    return data


def resolve(
    key: str,
    argument: T | None,
    env: str | None,
    file_section: Mapping[str, Any],
    default: T,
    convert: Callable[[Any], T],
) -> T:
    """argument > environment variable ``env`` > file value under ``key`` > default."""
    if argument is not None:
        return argument
    if env is not None and os.environ.get(env) not in (None, ""):
        raw: Any = os.environ[env]
        source = env
    elif key in file_section:
        raw = file_section[key]
        source = key
    else:
        return default
    try:
        return convert(raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(source, f"invalid value {raw!r}: {exc}") from exc


ValueKind = str  # "bool", "int", "float", "duration", "str"


def typed_value(key: str, kind: ValueKind, value: Any, *, text: bool = False) -> Any:
    """``value`` as a ``kind`` setting, by the one rule above; ``text``: it came from an
    environment variable or the command line (a string to parse). Errors name ``key``."""
    if text and isinstance(value, str):
        return _from_text(key, kind, value.strip())
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(key, f"must be true or false, not {value!r}")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, f"must be an integer, not {value!r}")
        return value
    if kind == "duration":
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ConfigError(key, f"not a duration: {value!r} (use 30s, 5m, 2h, 1d)")
        return parse_duration(value, key)
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(key, f"must be a number, not {value!r}")
        if not math.isfinite(value):
            raise ConfigError(key, f"must be a finite number, not {value!r}")
        return float(value)
    if kind == "str":
        if value is not None and not isinstance(value, str):
            raise ConfigError(key, f"must be a string, not {value!r}")
        return value
    return value


def _from_text(key: str, kind: ValueKind, text: str) -> Any:
    if kind == "bool":
        lowered = text.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ConfigError(key, f"must be true or false, not {text!r}")
    if kind == "int":
        try:
            return int(text)
        except ValueError as exc:
            raise ConfigError(key, f"must be an integer, not {text!r}") from exc
    if kind == "float":
        try:
            number = float(text)
        except ValueError as exc:
            raise ConfigError(key, f"must be a number, not {text!r}") from exc
        return typed_value(key, kind, number)
    if kind == "duration":
        return parse_duration(text, key)
    return text


def resolve_typed(key: str, argument: Any, env: str | None, file_section: Mapping[str, Any],
                  default: Any, kind: ValueKind, *aliases: str,
                  argument_key: str | None = None) -> Any:
    """:func:`resolve` by the one value rule: an argument or environment value is text
    (or already typed), a file value must have the setting's type. ``aliases``: older
    file keys that still name the setting; ``argument_key``: the name errors in the
    argument give (its command-line option's)."""
    if argument is not None:
        return typed_value(argument_key or key, kind, argument, text=True)
    if env is not None and os.environ.get(env) not in (None, ""):
        return typed_value(env, kind, os.environ[env], text=True)
    for name in (key, *aliases):
        if name in file_section:
            return typed_value(name, kind, file_section[name])
    return default


def _type_name(annotation: Any) -> str:
    """A dataclass field's type as written (``"int"``, ``"float | None"``): a string under
    ``from __future__ import annotations``, the type itself in a compiled module."""
    if isinstance(annotation, str):
        return annotation
    return annotation.__name__ if isinstance(annotation, type) else str(annotation)


def read_section(kind: Any, f: Mapping[str, Any], name: str) -> Any:
    """The ``name`` mapping of a config file as the ``kind`` dataclass, each value read by
    its field's type (a ``*_seconds`` float as a duration); unknown keys and wrong values
    are errors naming ``name.key``."""
    raw = f.get(name) or {}
    if not isinstance(raw, dict):
        raise ConfigError(name, "must be a mapping")
    fields = kind.__dataclass_fields__
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in fields:
            raise ConfigError(f"{name}.{key}",
                              f"unknown key; known: {', '.join(sorted(fields))}")
        type_name = _type_name(fields[key].type)
        value_kind = ("duration" if type_name == "float" and key.endswith("_seconds")
                      else "str" if type_name.startswith("str") else type_name)
        values[key] = typed_value(f"{name}.{key}", value_kind, value)
    return kind(**values)


def parse_host_port(value: str, key: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) into a tuple; errors name ``key``."""
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ConfigError(key, f"expected HOST:PORT, got {value!r}")
    host = host.strip("[]")
    try:
        port_number = int(port)
    except ValueError as exc:
        raise ConfigError(key, f"port must be a number, got {port!r}") from exc
    if not 0 <= port_number <= 65535:
        raise ConfigError(key, f"port out of range: {port_number}")
    return host, port_number


def parse_duration(value: str | float | int, key: str) -> float:
    """Seconds from ``30``, ``30s``, ``5m``, ``2h`` or ``1d``: finite, not negative."""
    if isinstance(value, bool):
        raise ConfigError(key, f"not a duration: {value!r} (use 30s, 5m, 2h, 1d)")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = value.strip().lower()
        units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
        factor = 1.0
        for suffix in ("ms", "s", "m", "h", "d"):
            if text.endswith(suffix):
                factor = units[suffix]
                text = text[: -len(suffix)]
                break
        try:
            seconds = float(text) * factor
        except ValueError as exc:
            raise ConfigError(key, f"not a duration: {value!r} (use 30s, 5m, 2h, 1d)") from exc
    if not math.isfinite(seconds):
        raise ConfigError(key, f"must be a finite duration: {value!r}")
    if seconds < 0:
        raise ConfigError(key, f"must not be negative: {value!r}")
    return seconds
