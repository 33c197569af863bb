"""RequestRecord's written ``__init__`` takes every field as the generated one did."""

from __future__ import annotations

import dataclasses

from tokenpath.records import RequestRecord
from tokenpath.stage_members import DECODE, PREFILL
from tokenpath.stages import STAGE_IDS, StageId


def _distinct_value(field: dataclasses.Field[object], index: int) -> object:
    """A value unlike the field's default that its ``__init__`` takes and keeps as given
    (the compiled core checks argument types, so the first of several kinds that fits)."""
    default = field.default
    candidates: list[object] = [f"value-{index}", not default if isinstance(default, bool)
                                else True, 1000 + index, 1000.5 + index, (f"value-{index}",),
                                {f"value-{index}": 1}]
    for candidate in candidates:
        try:
            record = RequestRecord(trace_id="a" * 32, **{field.name: candidate})
        except TypeError:
            continue
        stored = getattr(record, field.name)
        if type(stored) is type(candidate) and stored == candidate:
            return candidate
    raise AssertionError(f"RequestRecord does not keep a value given for {field.name}")


def test_every_field_is_taken_by_name_and_kept() -> None:
    for index, field in enumerate(dataclasses.fields(RequestRecord)):
        if field.name == "trace_id":
            continue
        value = _distinct_value(field, index)
        record = RequestRecord(trace_id="a" * 32, **{field.name: value})
        assert getattr(record, field.name) == value, field.name
        # and in field order, positionally, as the generated __init__ took them
        positional = [getattr(RequestRecord(trace_id="a" * 32), f.name)
                      for f in dataclasses.fields(RequestRecord)][:index]
        positional[0] = "b" * 32
        record = RequestRecord(*positional, value)
        assert getattr(record, field.name) == value, field.name


def test_defaults_are_the_declared_ones() -> None:
    record = RequestRecord(trace_id="c" * 32)
    for field in dataclasses.fields(RequestRecord):
        if field.name in ("trace_id", "record_id"):
            continue
        expected = (field.default_factory() if field.default_factory
                    is not dataclasses.MISSING else field.default)
        assert getattr(record, field.name) == expected, field.name
    assert record.record_id == record.trace_id  # a record of a one-call trace


def test_mutable_defaults_are_not_shared() -> None:
    first, second = RequestRecord(trace_id="d" * 32), RequestRecord(trace_id="e" * 32)
    first.stages[StageId(STAGE_IDS[0])] = None  # type: ignore[assignment]
    first.miss_tokens[PREFILL.value] = 1
    first.miss_dollars[DECODE.value] = 1.0
    assert second.stages == {} and second.miss_tokens == {} and second.miss_dollars == {}


def test_replace_and_equality_still_work() -> None:
    record = RequestRecord(trace_id="f" * 32, model="m", input_tokens=3)
    copy = dataclasses.replace(record, input_tokens=4)
    assert copy.input_tokens == 4 and copy.model == "m" and copy.record_id == record.record_id
    assert dataclasses.replace(copy, input_tokens=3) == record
