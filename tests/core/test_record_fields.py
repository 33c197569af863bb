"""The field table (tokenpath/record_fields.py) is the one declaration of RequestRecord's
fields: records.py's generated part matches it, and the class has exactly its fields."""

from __future__ import annotations

import dataclasses

import pytest

from tokenpath import record_fields
from tokenpath.records import RequestRecord


def test_the_generated_part_of_records_py_is_what_the_table_gives() -> None:
    source = record_fields.RECORDS_PY.read_text(encoding="utf-8")
    assert record_fields.generated_part(source) == record_fields.generated_class_body(), (
        "tokenpath/records.py is stale: run python -m tokenpath.record_fields")
    assert record_fields.main(["--check"]) == 0


def test_the_class_has_the_table_s_fields_in_its_order() -> None:
    assert tuple(f.name for f in dataclasses.fields(RequestRecord)) == record_fields.FIELD_NAMES


def test_to_json_and_from_json_cover_every_field() -> None:
    record = RequestRecord(trace_id="a" * 32)
    data = record.to_json()
    assert set(record_fields.FIELD_NAMES) <= set(data)
    assert RequestRecord.from_json(data) == record


def test_a_field_added_to_the_table_changes_the_generated_code(
        monkeypatch: pytest.MonkeyPatch) -> None:
    extra = record_fields.RecordField("extra_seconds", record_fields.OPT_FLOAT, "None")
    monkeypatch.setattr(record_fields, "FIELDS", (*record_fields.FIELDS, extra))
    body = record_fields.generated_class_body()
    for line in ("    extra_seconds: float | None = None",
                 "        extra_seconds: float | None = None,",
                 "        self.extra_seconds = extra_seconds",
                 '            "extra_seconds": self.extra_seconds,',
                 '            extra_seconds=_opt_float(data.get("extra_seconds")),'):
        assert line + "\n" in body, line
