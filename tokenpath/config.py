"""Config plumbing shared by every component: errors that name the key, and precedence.

Each component has its own dataclass with named default constants and a ``validate()``
that raises :class:`ConfigError` naming the offending key. Values resolve in the order
argument > environment > file > default (:func:`resolve`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value is missing or wrong; ``key`` names it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


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
