"""The price sheet: $/hour per GPU type, node inventory and pools, CPU and network prices.

Loaded from YAML (the shipped default is ``tokenpath/data/prices.yaml``; ``--prices FILE``
replaces it). ``validate()`` raises :class:`tokenpath.config.ConfigError` naming the key,
e.g. ``gpus.H100-SXM.dollars_per_hour: must be > 0``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from tokenpath.config import ConfigError, check, validate_fields

SECONDS_PER_HOUR = 3600.0
BYTES_PER_GB = 1e9
DEFAULT_POOL = "default"
DEFAULT_GPU_TYPE = "H100-SXM"
DEFAULT_PRICES_RESOURCE = "data/prices.yaml"


@dataclass(frozen=True, slots=True)
class GpuPrice:
    dollars_per_hour: float

    @property
    def dollars_per_second(self) -> float:
        return self.dollars_per_hour / SECONDS_PER_HOUR


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node of the inventory. ``None`` fields are filled from the request records."""

    gpu_type: str | None = None  # must have a price in the sheet's gpus (PriceSheet.validate)
    gpu_count: int | None = field(default=None, metadata=check(ge=1, optional=True))
    pool: str = field(default=DEFAULT_POOL, metadata=check(non_empty=True))


@dataclass(frozen=True, slots=True)
class ModelListPrice:
    """A hosted API's list price, for comparison only."""

    input_dollars_per_million: float
    output_dollars_per_million: float


@dataclass(slots=True)
class PriceSheet:
    gpus: dict[str, GpuPrice] = field(default_factory=dict)
    cpu_dollars_per_core_hour: float = 0.0
    network_dollars_per_gb: float = 0.0
    nodes: dict[str, NodeSpec] = field(default_factory=dict)
    default_node: NodeSpec = field(default_factory=NodeSpec)
    default_gpu_type: str = DEFAULT_GPU_TYPE
    models: dict[str, ModelListPrice] = field(default_factory=dict)

    def validate(self) -> None:
        if not self.gpus:
            raise ConfigError("gpus", "at least one GPU type needs a price")
        for name, price in self.gpus.items():
            _positive(f"gpus.{name}.dollars_per_hour", price.dollars_per_hour)
        _non_negative("cpu.dollars_per_core_hour", self.cpu_dollars_per_core_hour)
        _non_negative("network.dollars_per_gb", self.network_dollars_per_gb)
        if self.default_gpu_type not in self.gpus:
            raise ConfigError("default_gpu_type", f"{self.default_gpu_type!r} has no price in gpus")
        for name, node in [*self.nodes.items(), ("", self.default_node)]:
            prefix = f"nodes.{name}" if name else "default_node"
            if node.gpu_type is not None and node.gpu_type not in self.gpus:
                raise ConfigError(f"{prefix}.gpu_type", f"{node.gpu_type!r} has no price in gpus")
            validate_fields(node, prefix)
        for name, listed in self.models.items():
            _non_negative(f"models.{name}.input_dollars_per_million",
                          listed.input_dollars_per_million)
            _non_negative(f"models.{name}.output_dollars_per_million",
                          listed.output_dollars_per_million)

    # -- lookups -------------------------------------------------------------------------

    def node_spec(self, node: str | None) -> NodeSpec:
        if node is not None and node in self.nodes:
            return self.nodes[node]
        return self.default_node

    def gpu_price(self, gpu_type: str | None) -> GpuPrice:
        """The price of ``gpu_type``; an unpriced or missing type falls back to the default."""
        if gpu_type is not None and gpu_type in self.gpus:
            return self.gpus[gpu_type]
        return self.gpus[self.default_gpu_type]

    @property
    def cpu_dollars_per_core_second(self) -> float:
        return self.cpu_dollars_per_core_hour / SECONDS_PER_HOUR

    @property
    def network_dollars_per_byte(self) -> float:
        return self.network_dollars_per_gb / BYTES_PER_GB


def _finite_number(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(key, f"must be a number, not {value!r}")
    if not math.isfinite(value):
        raise ConfigError(key, f"must be a finite number, not {value!r}")
    return float(value)


def _positive(key: str, value: float) -> None:
    if not _finite_number(key, value) > 0:
        raise ConfigError(key, "must be > 0")


def _non_negative(key: str, value: float) -> None:
    if not _finite_number(key, value) >= 0:
        raise ConfigError(key, "must be >= 0")


def _mapping(value: Any, key: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(key, "must be a mapping")
    return value


def _number(section: dict[str, Any], name: str, key: str, default: float | None = None) -> float:
    if name not in section or section[name] is None:
        if default is None:
            raise ConfigError(f"{key}.{name}", "is required")
        return default
    raw = section[name]
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise ConfigError(f"{key}.{name}", f"must be a number, got {raw!r}")
    return float(raw)


def _node(data: Any, key: str) -> NodeSpec:
    section = _mapping(data, key)
    count = section.get("gpu_count")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int)):
        raise ConfigError(f"{key}.gpu_count", f"must be an integer, got {count!r}")
    gpu_type = section.get("gpu_type")
    if gpu_type is not None and not isinstance(gpu_type, str):
        raise ConfigError(f"{key}.gpu_type", f"must be a string, got {gpu_type!r}")
    pool = section.get("pool", DEFAULT_POOL)
    if not isinstance(pool, str):
        raise ConfigError(f"{key}.pool", f"must be a string, got {pool!r}")
    return NodeSpec(gpu_type=gpu_type, gpu_count=count, pool=pool)


def price_sheet_from_mapping(data: dict[str, Any]) -> PriceSheet:
    """Build and validate a sheet from a parsed YAML mapping."""
    gpus = {
        str(name): GpuPrice(_number(_mapping(value, f"gpus.{name}"), "dollars_per_hour",
                                    f"gpus.{name}"))
        for name, value in _mapping(data.get("gpus"), "gpus").items()
    }
    models = {
        str(name): ModelListPrice(
            _number(_mapping(value, f"models.{name}"), "input_dollars_per_million",
                    f"models.{name}"),
            _number(_mapping(value, f"models.{name}"), "output_dollars_per_million",
                    f"models.{name}"),
        )
        for name, value in _mapping(data.get("models"), "models").items()
    }
    default_gpu = data.get("default_gpu_type", DEFAULT_GPU_TYPE)
    if not isinstance(default_gpu, str):
        raise ConfigError("default_gpu_type", f"must be a string, got {default_gpu!r}")
    sheet = PriceSheet(
        gpus=gpus,
        cpu_dollars_per_core_hour=_number(_mapping(data.get("cpu"), "cpu"),
                                          "dollars_per_core_hour", "cpu", 0.0),
        network_dollars_per_gb=_number(_mapping(data.get("network"), "network"),
                                       "dollars_per_gb", "network", 0.0),
        nodes={str(name): _node(value, f"nodes.{name}")
               for name, value in _mapping(data.get("nodes"), "nodes").items()},
        default_node=_node(data.get("default_node"), "default_node"),
        default_gpu_type=default_gpu,
        models=models,
    )
    sheet.validate()
    return sheet


def load_price_sheet(path: str | Path | None = None) -> PriceSheet:
    """The sheet at ``path``, or the shipped default when ``path`` is None."""
    if path is None:
        text = (resources.files("tokenpath") / DEFAULT_PRICES_RESOURCE).read_text(encoding="utf-8")
        source = "default price sheet"
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError("prices", f"cannot read {path}: {exc.strerror or exc}") from exc
        source = str(path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("prices", f"{source} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError("prices", f"{source} must hold a mapping at the top level")
    return price_sheet_from_mapping(data)
