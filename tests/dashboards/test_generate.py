"""Generated dashboards and rules: committed files equal the code's output, byte for byte,
and the dashboards are built only from the metric and stage tables."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import typer
from typer.testing import CliRunner

from tokenpath import metric_names as mn
from tokenpath.cli.main import app
from tokenpath.dashboards import budgets, generate, rules
from tokenpath.dashboards import queries as q
from tokenpath.dashboards.definitions import DASHBOARDS, STAGE_QUANTILES
from tokenpath.stages import STAGE_IDS, STAGES

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS_SOURCE = REPO / "dashboards"


def _all_panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    panels: list[dict[str, Any]] = []
    for panel in board["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    return panels


def _exprs(board: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in _all_panels(board) for t in p.get("targets", [])]


def _known_series() -> set[str]:
    specs = [v for v in vars(mn).values() if isinstance(v, mn.MetricSpec)]
    names = {s.series for s in specs}
    for spec in specs:
        if spec.type == "histogram":
            names |= {spec.series + suffix for suffix in (
                mn.HISTOGRAM_BUCKET_SUFFIX, mn.HISTOGRAM_SUM_SUFFIX, mn.HISTOGRAM_COUNT_SUFFIX)}
    return names


def _recorded_series() -> set[str]:
    groups = rules.rule_groups(rules.RuleParams())["groups"] + [
        budgets.budget_group([budgets.Budget("t", 1.0, "day")], rules.RuleParams())]
    return {r["record"] for g in groups for r in g["rules"] if "record" in r}


def test_committed_files_match_generated_byte_for_byte() -> None:
    assert generate.stale_files(REPO, cli=typer.main.get_command(app)) == []


def test_build_command_reproduces_committed_files(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["dashboards", "build", "--output", str(tmp_path)])
    assert result.exit_code == 0, result.output
    for relative in generate.generated_files(cli=typer.main.get_command(app)):
        assert (tmp_path / relative).read_bytes() == (REPO / relative).read_bytes(), relative


def test_build_check_reports_a_stale_file(tmp_path: Path) -> None:
    generate.write_generated(tmp_path)
    (tmp_path / generate.RULES_FILE).write_text("groups: []\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["dashboards", "build", "--check",
                                      "--output", str(tmp_path)])
    assert result.exit_code == 1
    assert str(generate.RULES_FILE) in result.output


def test_each_dashboard_has_stable_uid_and_the_shared_variables() -> None:
    uids = set()
    for definition in DASHBOARDS:
        board = json.loads((REPO / generate.GRAFANA_DIR / f"{definition.file_stem}.json")
                           .read_text(encoding="utf-8"))
        assert board["uid"] == definition.uid
        uids.add(board["uid"])
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables[q.VAR_DATASOURCE]["type"] == "datasource"
        assert variables[q.VAR_MODEL]["type"] == "query"
        assert variables[q.VAR_POOL]["type"] == "query"
        for panel in _all_panels(board):
            for target in panel.get("targets", []):
                assert target["datasource"]["uid"] == f"${{{q.VAR_DATASOURCE}}}"
    assert len(uids) == len(DASHBOARDS)


def test_queries_use_only_known_metric_series() -> None:
    known = _known_series()
    for definition in DASHBOARDS:
        board = json.loads(json.dumps(definition.build().build(), default=lambda o: o.to_json()))
        exprs = _exprs(board)
        assert exprs, definition.uid
        for expr in exprs:
            for name in re.findall(rf"(?<![:\w]){mn.NAMESPACE}_\w+", expr):
                assert name in known, (definition.uid, name)
            # recorded series (level:metric:operations) come from the generated rules
            for name in re.findall(rf"\b\w+:{mn.NAMESPACE}_\w+:\w+", expr):
                assert name in _recorded_series(), (definition.uid, name)


def test_stages_dashboard_has_latency_and_cost_for_every_stage() -> None:
    board = json.loads((REPO / generate.GRAFANA_DIR / "stages.json").read_text("utf-8"))
    exprs = "\n".join(_exprs(board))
    for stage in STAGES:
        per_stage = exprs.count(q.eq(mn.LABEL_STAGE, stage.id.value))
        assert per_stage == len(STAGE_QUANTILES) + 1, stage.id
        assert any(p.get("title", "").startswith(stage.title) for p in _all_panels(board))


def test_overview_hit_ratio_is_token_weighted() -> None:
    board = json.loads((REPO / generate.GRAFANA_DIR / "overview.json").read_text("utf-8"))
    hit = next(p for p in _all_panels(board) if p.get("title") == "Prefix-cache hit ratio")
    expr = hit["targets"][0]["expr"]
    numerator, denominator = expr.split("\n/\n")
    assert q.eq(mn.LABEL_KIND, mn.TOKEN_KIND_CACHE_READ) in numerator
    assert q.eq(mn.LABEL_KIND, mn.TOKEN_KIND_INPUT) in denominator
    assert numerator.startswith("sum") and denominator.startswith("sum")


def test_dashboards_source_spells_no_metric_or_stage_name() -> None:
    stage_ids = {stage.value for stage in STAGE_IDS}
    for path in DASHBOARDS_SOURCE.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert not node.value.startswith(f"{mn.NAMESPACE}_"), (path, node.value)
                assert node.value not in stage_ids, (path, node.value)
