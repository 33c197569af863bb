"""Everything ``tokenpath dashboards build`` writes, as relative path -> text.

The same function feeds the writer and the byte-for-byte regeneration test, so what is
committed is exactly what the code produces.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenpath.dashboards import budgets, k8s, rules
from tokenpath.dashboards.definitions import DASHBOARDS
from tokenpath.dashboards.panels import to_json

GRAFANA_DIR = Path("dashboards/grafana")
RULES_FILE = Path("dashboards/rules/tokenpath-rules.yml")
# The example budgets' rules: what `tokenpath dashboards budget-rules` makes of
# deploy/budgets.example.yml, unit-tested by promtool (dashboards/rules/tests).
BUDGETS_EXAMPLE = Path("deploy/budgets.example.yml")
SOURCE_ROOT = Path(__file__).resolve().parents[1]  # the checkout the code runs from
BUDGET_RULES_EXAMPLE_FILE = Path("dashboards/rules/tokenpath-budgets.example.yml")
K8S_GENERATED_DIR = Path("deploy/k8s/generated")
PROMETHEUS_RULE_FILE = K8S_GENERATED_DIR / "prometheusrule.yaml"
DASHBOARD_CONFIGMAPS_FILE = K8S_GENERATED_DIR / "dashboard-configmaps.yaml"
REFERENCE_FILE = Path("docs/reference.md")


def dashboard_files() -> dict[Path, str]:
    return {GRAFANA_DIR / f"{d.file_stem}.json": to_json(d.build()) for d in DASHBOARDS}


def generated_files(params: rules.RuleParams | None = None,
                    cli: Any = None) -> dict[Path, str]:
    """Every generated file (relative to the repository root) and its exact content;
    docs/reference.md only given the CLI's root command (``tokenpath dashboards build``
    passes its own: this package does not import the CLI)."""
    params = params or rules.RuleParams()
    example_budgets = budgets.load_budgets(SOURCE_ROOT / BUDGETS_EXAMPLE)
    dashboards = dashboard_files()
    config_maps = [k8s.dashboard_config_map(path.stem, text)
                   for path, text in sorted(dashboards.items())]
    files = {
        **dashboards,
        RULES_FILE: rules.rules_yaml(params),
        BUDGET_RULES_EXAMPLE_FILE: budgets.budget_rules_yaml(example_budgets, params),
        PROMETHEUS_RULE_FILE: k8s.documents_yaml([k8s.prometheus_rule(params)]),
        DASHBOARD_CONFIGMAPS_FILE: k8s.documents_yaml(config_maps),
    }
    if cli is not None:
        from tokenpath.dashboards.reference import reference_markdown

        files[REFERENCE_FILE] = reference_markdown(cli)
    return files


def write_generated(root: Path, params: rules.RuleParams | None = None,
                    cli: Any = None) -> list[Path]:
    """Write every generated file under ``root``; returns the paths written."""
    written: list[Path] = []
    for relative, text in generated_files(params, cli).items():
        target = root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        written.append(target)
    return written


def stale_files(root: Path, params: rules.RuleParams | None = None,
                cli: Any = None) -> list[Path]:
    """Generated files under ``root`` whose content differs from the code's output."""
    stale: list[Path] = []
    for relative, text in generated_files(params, cli).items():
        target = root / relative
        if not target.is_file() or target.read_bytes() != text.encode("utf-8"):
            stale.append(relative)
    return stale
