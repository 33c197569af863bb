"""The field-metadata checker of tokenpath/config.py (``check``, ``validate_fields``): the
messages it gives, the values it accepts, and every component config that declares its
constraints with it (a field's rule is checked by that config's ``validate()``)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenpath.agent.config import AgentConfig
from tokenpath.cli.demo_cmd import DemoConfig
from tokenpath.collector.assembler import AssemblerConfig
from tokenpath.collector.call_join import JoinConfig
from tokenpath.collector.config import CollectorConfig
from tokenpath.collector.cost.attributor import AttributorConfig
from tokenpath.collector.cost.prices import NodeSpec
from tokenpath.collector.forwarder import ForwarderConfig
from tokenpath.collector.limits import IngestLimits
from tokenpath.collector.whatif_view import WhatIfRequest
from tokenpath.config import (
    CHECK_METADATA_KEY,
    Check,
    ConfigError,
    check,
    field_checks,
    validate_fields,
)
from tokenpath.dashboards.push import PushConfig
from tokenpath.dashboards.rules import RuleParams
from tokenpath.instrumentation.fingerprints import FingerprintConfig
from tokenpath.instrumentation.network import LinkModel
from tokenpath.instrumentation.reference.disaggregated import KvLinkConfig
from tokenpath.instrumentation.reference.engine import EngineConfig
from tokenpath.instrumentation.reference.scheduler import SchedulerConfig
from tokenpath.instrumentation.reference.serving_path import ReferencePathConfig
from tokenpath.instrumentation.reference.workload import WorkloadConfig
from tokenpath.instrumentation.tenants import TenantConfig
from tokenpath.instrumentation.vllm.config import PluginConfig
from tokenpath.instrumentation.vllm.launcher import LocalVllmConfig
from tokenpath.slo import SloClass


@dataclass(frozen=True, slots=True)
class _Example:
    count: int = field(default=1, metadata=check(ge=1))
    ratio: float = field(default=0.5, metadata=check(ge=0.0, le=1.0))
    timeout_seconds: float = field(default=1.0, metadata=check(gt=0, key="timeout"))
    mode: str = field(default="a", metadata=check(one_of=("a", "b")))
    limit: int | None = field(default=None, metadata=check(ge=1, optional=True))
    names: tuple[str, ...] = field(default=("x",), metadata=check(non_empty=True))
    tags: list[str] = field(default_factory=lambda: ["t"], metadata=check(max_length=2))
    unchecked: int = -5


def test_a_config_of_good_values_passes() -> None:
    validate_fields(_Example(), "example")


@pytest.mark.parametrize(("change", "key", "message"), [
    ({"count": 0}, "example.count", "must be >= 1"),
    ({"ratio": 1.5}, "example.ratio", "must be between 0 and 1"),
    ({"timeout_seconds": 0.0}, "example.timeout", "must be > 0"),
    ({"mode": "c"}, "example.mode", "must be one of a, b"),
    ({"limit": 0}, "example.limit", "must be >= 1"),
    ({"names": ()}, "example.names", "must not be empty"),
    ({"tags": ["a", "b", "c"]}, "example.tags", "must be at most 2 characters"),
])
def test_an_error_names_the_section_and_key(change: dict[str, Any], key: str,
                                            message: str) -> None:
    with pytest.raises(ConfigError) as error:
        validate_fields(dataclasses.replace(_Example(), **change), "example")
    assert (error.value.key, error.value.message) == (key, message)
    assert str(error.value) == f"{key}: {message}"


def test_without_a_section_the_key_stands_alone() -> None:
    with pytest.raises(ConfigError) as error:
        validate_fields(_Example(timeout_seconds=-1.0))
    assert error.value.key == "timeout"


def test_the_first_failing_field_in_declaration_order_is_named() -> None:
    with pytest.raises(ConfigError) as error:
        validate_fields(_Example(mode="z", count=0), "example")
    assert error.value.key == "example.count"


def test_a_field_without_a_check_is_not_checked() -> None:
    validate_fields(_Example(unchecked=-(10**9)), "example")
    assert [name for name, _ in field_checks(_Example)] == [
        "count", "ratio", "timeout_seconds", "mode", "limit", "names", "tags"]


def test_none_passes_an_optional_field_only() -> None:
    assert Check(ge=1, optional=True).problem(None) is None
    assert Check(ge=1).problem(None) == "must be >= 1"
    assert Check(non_empty=True).problem(None) == "must not be empty"


@pytest.mark.parametrize(("rules", "message"), [
    ({"ge": 1}, "must be >= 1"),
    ({"gt": 0}, "must be > 0"),
    ({"le": 10}, "must be <= 10"),
    ({"lt": 0.5}, "must be < 0.5"),
    ({"ge": -1.0, "le": 1.0}, "must be between -1 and 1"),
    ({"ge": 0.05, "le": 1.0}, "must be between 0.05 and 1"),
    ({"gt": 0, "le": 60}, "must be > 0 and <= 60"),
    ({"integer": True, "gt": 0}, "must be an integer > 0"),
    ({"finite": True, "gt": 0}, "must be a finite number > 0"),
    ({"finite": True}, "must be a finite number"),
    ({"integer": True, "ge": 1, "le": 9}, "must be an integer between 1 and 9"),
    ({"one_of": ("auto", "off")}, "must be one of auto, off"),
    ({"boolean": True}, "must be true or false"),
    ({"non_empty": True}, "must not be empty"),
    ({"min_length": 16}, "must be at least 16 characters"),
    ({"ge": 1, "message": "must be at least 1, got {value!r}"},
     "must be at least 1, got {value!r}"),
])
def test_the_rules_say_what_they_ask(rules: dict[str, Any], message: str) -> None:
    assert Check(**rules).describe() == message


def test_a_given_message_has_the_value_filled_in() -> None:
    rule = Check(ge=1, le=10, message="must be between 1 and 10, got {value!r}")
    assert rule.problem(0) == "must be between 1 and 10, got 0"
    assert Check(gt=0, message="port out of range: {value}").problem(-3) == (
        "port out of range: -3")


def test_a_lower_bound_is_given_once() -> None:
    with pytest.raises(ValueError):
        check(ge=1, gt=0)
    with pytest.raises(ValueError):
        check(le=1, lt=2)


def test_the_metadata_is_read_only_and_holds_the_check() -> None:
    metadata = check(ge=1)
    assert metadata[CHECK_METADATA_KEY] == Check(ge=1)
    with pytest.raises(TypeError):
        metadata[CHECK_METADATA_KEY] = Check()  # type: ignore[index]
    (count,) = [f for f in dataclasses.fields(_Example) if f.name == "count"]
    assert count.metadata[CHECK_METADATA_KEY] == Check(ge=1)
    assert count.default == 1  # the default is the field's own


def test_frozen_slots_dataclasses_keep_working() -> None:
    example = _Example(count=3)
    assert example.count == 3 and example.tags == ["t"]
    assert _Example().tags is not _Example().tags  # a default_factory, not a shared list
    with pytest.raises(dataclasses.FrozenInstanceError):
        example.count = 4  # type: ignore[misc]
    assert not hasattr(example, "__dict__")


def test_integers_and_booleans() -> None:
    assert Check(integer=True, gt=0).problem(True) == "must be an integer > 0"
    assert Check(integer=True, gt=0).problem(2.0) == "must be an integer > 0"
    assert Check(integer=True, gt=0).problem(2) is None
    assert Check(boolean=True).problem(1) == "must be true or false"
    assert Check(boolean=True).problem(False) is None


_bound = st.one_of(st.none(), st.integers(-5, 5), st.floats(-5, 5, allow_nan=False))
_number = st.one_of(st.integers(-10, 10), st.floats(allow_nan=True, allow_infinity=True))


@given(value=_number, ge=_bound, le=_bound, strict_low=st.booleans(), strict_high=st.booleans(),
       finite=st.booleans())
def test_a_number_is_accepted_exactly_when_it_is_within_every_bound(
        value: float, ge: float | None, le: float | None, strict_low: bool, strict_high: bool,
        finite: bool) -> None:
    rules: dict[str, Any] = {"finite": finite}
    if ge is not None:
        rules["gt" if strict_low else "ge"] = ge
    if le is not None:
        rules["lt" if strict_high else "le"] = le
    rule = Check(**rules)
    expected = (not finite or math.isfinite(value)) and (
        ge is None or (value > ge if strict_low else value >= ge)) and (
        le is None or (value < le if strict_high else value <= le))
    assert rule.accepts(value) is expected
    assert (rule.problem(value) is None) is expected
    if math.isnan(value) and rule.bounded:
        assert not rule.accepts(value)  # NaN is within no bound


@given(value=st.text(max_size=8), choices=st.lists(st.text(max_size=3), max_size=4))
def test_one_of_accepts_the_choices_only(value: str, choices: list[str]) -> None:
    assert Check(one_of=tuple(choices)).accepts(value) is (value in choices)


@given(value=st.text(max_size=30), low=st.integers(0, 20), high=st.integers(0, 20))
def test_lengths(value: str, low: int, high: int) -> None:
    assert Check(min_length=low, max_length=high).accepts(value) is (
        low <= len(value) <= high)
    assert Check(non_empty=True).accepts(value) is (value != "")


# -- every config that declares its constraints -------------------------------------------

def _bad_value(rule: Check, default: Any) -> Any:
    """A value the rule refuses (for a field whose default it accepts)."""
    if rule.boolean:
        return "yes"
    if rule.one_of is not None:
        return "no-such-choice"
    if rule.non_empty:
        return type(default)() if default is not None else ""
    if rule.min_length is not None:
        return "x" * (rule.min_length - 1)
    if rule.max_length is not None:
        return "x" * (rule.max_length + 1)
    integer = isinstance(default, int) and not isinstance(default, bool)
    for bound, step in ((rule.ge, -1), (rule.gt, 0), (rule.le, 1), (rule.lt, 0)):
        if bound is not None:
            bad = bound + step
            return int(bad) if integer and float(bad).is_integer() else bad
    return math.nan


def _validate(config: Any) -> None:
    if isinstance(config, SloClass):
        config.validate("slo_classes[0]")
    else:
        config.validate()


_CONFIGS: list[tuple[Callable[[], Any], str]] = [
    (AssemblerConfig, "assembler."),
    (JoinConfig, "join."),
    (AttributorConfig, "cost."),
    (IngestLimits, "limits."),
    (lambda: ForwarderConfig("http://localhost:4318"), "forward_records."),
    (WhatIfRequest, ""),
    (CollectorConfig, ""),
    (NodeSpec, None),  # checked by PriceSheet.validate under nodes.NAME / default_node
    (AgentConfig, ""),
    (lambda: SloClass("interactive", ttft_seconds=1.0), "slo_classes[0]."),
    (lambda: DemoConfig(duration=None, rps=1.0, store_path=":memory:", ground_truth=None,
                        collector_host="127.0.0.1", collector_port=0), ""),
    (EngineConfig, ""),
    (SchedulerConfig, ""),
    (ReferencePathConfig, ""),
    (WorkloadConfig, ""),
    (KvLinkConfig, ""),
    (LinkModel, ""),
    (FingerprintConfig, ""),
    (TenantConfig, "tenants."),
    (PluginConfig, ""),
    (LocalVllmConfig, ""),
    (RuleParams, ""),
    (PushConfig, ""),
]


@pytest.mark.parametrize(("make", "prefix"), _CONFIGS)
def test_each_declared_rule_is_checked_by_its_configs_validate(
        make: Callable[[], Any], prefix: str | None, tmp_path: Path) -> None:
    config = make()
    checks = field_checks(config)
    assert checks, f"{type(config).__name__} declares no rule"
    if prefix is None:
        validate_fields(config, "default_node")
    else:
        _validate(config)  # its defaults pass
    for name, rule in checks:
        bad = _bad_value(rule, getattr(config, name))
        broken = dataclasses.replace(config, **{name: bad})
        with pytest.raises(ConfigError) as error:
            if prefix is None:
                validate_fields(broken, "default_node")
            else:
                _validate(broken)
        expected = ("default_node." if prefix is None else prefix) + (rule.key or name)
        assert error.value.key == expected, (name, bad)
        assert error.value.message == rule.describe().format(value=bad)
