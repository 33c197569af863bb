"""docs/stages.md carries the stage table generated from tokenpath.stages, verbatim."""

from __future__ import annotations

from pathlib import Path

from tokenpath.stages import STAGES

DOC = Path(__file__).resolve().parents[2] / "docs" / "stages.md"


def stage_table_markdown() -> str:
    lines = ["| # | id | stage | emitted or derived by | bound by | group |",
             "|---|----|-------|------------------------|----------|-------|"]
    lines.extend(
        f"| {s.order} | `{s.id.value}` | {s.title} | {s.emitted_by} | {s.bound_by} | "
        f"{s.group.value} |"
        for s in STAGES
    )
    return "\n".join(lines)


def test_stage_table_in_docs_matches_the_stage_module() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert stage_table_markdown() in text, (
        "docs/stages.md is out of date; paste the output of "
        "tests.core.test_stages_doc.stage_table_markdown()"
    )
