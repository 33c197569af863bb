"""The docs' figure tables are what bench/reference_results.json renders, and that file
holds one well-formed entry for every `make bench` target, with the bench's target."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench import reference
from bench.__main__ import TARGETS

REPO = Path(__file__).resolve().parents[2]
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
COMMITS = re.compile(r"^[0-9a-f]{7,40}(, [0-9a-f]{7,40})*$")
REQUIRED = ("id", "group", "name", "value", "unit", "target", "command", "method",
            "measured")


def _entries() -> list[dict[str, object]]:
    document = json.loads(reference.RESULTS_FILE.read_text(encoding="utf-8"))
    entries: list[dict[str, object]] = document["figures"]
    return entries


@pytest.mark.parametrize("doc", reference.DOCS, ids=str)
def test_each_docs_table_is_what_the_reference_file_renders(doc: Path) -> None:
    text = (REPO / doc).read_text(encoding="utf-8")
    found = reference.sections(text)
    assert found, f"{doc} has no <!-- figures:begin --> section"
    for group, body in found:
        assert body == reference.render_table(group=group), (
            f"{doc}: the figures table differs from bench/reference_results.json; "
            "run `python -m bench reference`")


def test_the_performance_doc_shows_every_figure() -> None:
    text = (REPO / "docs" / "performance.md").read_text(encoding="utf-8")
    assert (None, reference.render_table()) in reference.sections(text)


def test_entries_are_well_formed() -> None:
    entries = _entries()
    ids = [e["id"] for e in entries]
    assert len(ids) == len(set(ids)), "duplicate ids"
    for entry in entries:
        missing = [key for key in REQUIRED if key not in entry]
        assert not missing, (entry.get("id"), missing)
        assert entry["group"] in reference.GROUPS, entry["id"]
        value = entry["value"]
        if isinstance(value, list):
            assert len(value) == 2 and value[0] <= value[1], entry["id"]
        target = entry["target"]
        if target is not None:
            assert isinstance(target, dict)
            assert target["op"] in reference.OPS, entry["id"]
        measured = entry["measured"]
        if measured is None:
            # Only a computed figure, or one with no recorded run, has no measurement.
            assert entry.get("modeled") or value is None, entry["id"]
            continue
        assert isinstance(measured, dict)
        assert DATE.match(str(measured["date"])), entry["id"]
        commits = measured.get("at") or measured.get("recorded_in")
        assert commits and COMMITS.match(str(commits)), entry["id"]


def test_every_make_bench_target_has_its_figure_with_the_same_target() -> None:
    figures = {f.bench_target: f for f in reference.load() if f.bench_target}
    labels = {t.label for t in TARGETS}
    assert labels - set(figures) == set(), "make bench targets without a reference figure"
    assert set(figures) - labels == set(), "bench_target labels that no make bench row has"
    for target in TARGETS:
        figure = figures[target.label]
        assert figure.op == target.op, target.label
        # The file states a percentage where the bench reports a fraction.
        scale = 100 if figure.unit == "%" and target.unit != "%" else 1
        assert figure.limit == pytest.approx(target.limit * scale), target.label


def _figure(value: object, op: str = "<=", limit: float = 3) -> reference.Figure:
    return reference.Figure.from_json(
        {"id": "t", "group": "collector", "name": "t", "value": value, "unit": "x",
         "target": {"op": op, "limit": limit}, "command": None, "method": "m",
         "measured": None})


def test_holds_is_computed_from_every_run_of_a_range() -> None:
    assert _figure([1.0, 2.0]).holds() == "yes"
    assert _figure([2.9, 3.3]).holds() == "in some runs"
    assert _figure([3.1, 3.3]).holds() == "no"
    assert _figure(0.95, ">=", 0.9).holds() == "yes"
    assert _figure(None).holds() == "not recorded"
    assert reference.format_value(_figure([2.92, 3.34])) == "2.92x to 3.34x"


def test_the_cli_check_reports_a_stale_table(tmp_path: Path) -> None:
    for relative in reference.DOCS:
        target = tmp_path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text((REPO / relative).read_text(encoding="utf-8"), encoding="utf-8")
    assert reference.main(["--check"], root=tmp_path) == 0
    perf = tmp_path / reference.DOCS[0]
    perf.write_text(perf.read_text(encoding="utf-8").replace("| yes |", "| no |", 1),
                    encoding="utf-8")
    assert reference.main(["--check"], root=tmp_path) == 1
    assert reference.main([], root=tmp_path) == 0
    assert perf.read_text(encoding="utf-8") == (REPO / reference.DOCS[0]).read_text("utf-8")
