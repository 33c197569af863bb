"""Generated rules: parameters, required annotations, and Debian's promtool on them."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tokenpath.config import ConfigError
from tokenpath.dashboards import budgets, generate, rules

REPO = Path(__file__).resolve().parents[2]
RULES_DIR = REPO / generate.RULES_FILE.parent
TESTS_DIR = RULES_DIR / "tests"
RUNBOOKS = REPO / "docs" / "runbooks.md"
RECORD_NAME = re.compile(r"^[a-z_]+:[a-z0-9_]+:[a-z0-9_]+$")


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not installed (scripts/install-system-deps.sh installs Debian's "
                    "prometheus package, which ships it; needs root)")
    return path


def test_promtool_check_rules_accepts_generated_file() -> None:
    result = subprocess.run([_promtool(), "check", "rules", str(REPO / generate.RULES_FILE)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_pass_from_their_folder() -> None:
    tests = sorted(p.name for p in TESTS_DIR.glob("*.yml"))
    assert tests
    result = subprocess.run([_promtool(), "test", "rules", *tests], cwd=TESTS_DIR,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_catch_a_broken_threshold(tmp_path: Path) -> None:
    """The unit tests fail when the regression rule stops firing (they can fail)."""
    promtool = _promtool()
    broken = rules.RuleParams(hit_relative_drop=0.95)
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "tests").mkdir()
    for test_file in TESTS_DIR.glob("*.yml"):
        shutil.copy(test_file, tmp_path / "rules" / "tests" / test_file.name)
    (tmp_path / "rules" / generate.RULES_FILE.name).write_text(rules.rules_yaml(broken),
                                                                  "utf-8")
    shutil.copy(REPO / generate.BUDGET_RULES_EXAMPLE_FILE,
                tmp_path / "rules" / generate.BUDGET_RULES_EXAMPLE_FILE.name)
    result = subprocess.run([promtool, "test", "rules",
                             *sorted(p.name for p in TESTS_DIR.glob("*.yml"))],
                            cwd=tmp_path / "rules" / "tests", capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode != 0
    assert "TokenpathPrefixCacheHitRegression" in result.stdout + result.stderr


def test_recording_rule_names_follow_level_metric_operations() -> None:
    document = rules.rule_groups(rules.RuleParams())
    records = [r["record"] for g in document["groups"] for r in g["rules"] if "record" in r]
    assert "model:tokenpath_prefix_cache_hit:ratio_rate5m" in records
    for name in records:
        assert RECORD_NAME.match(name), name


def test_alerts_carry_severity_summary_description_and_runbook() -> None:
    anchors = set(re.findall(r'<a id="([a-z0-9-]+)"></a>', RUNBOOKS.read_text("utf-8")))
    document = rules.rule_groups(rules.RuleParams())
    alerts = [r for g in document["groups"] for r in g["rules"] if "alert" in r]
    names = {a["alert"] for a in alerts}
    assert {"TokenpathPrefixCacheHitRegression", "TokenpathCostPerTokenSpike",
            "TokenpathCacheMissWasteHigh", "TokenpathCollectorDroppingSpans",
            "TokenpathCollectorEvictingTraces", "TokenpathAgentDown",
            "TokenpathNVMLDown"} <= names
    burns = {n for n in names if n.startswith(rules.SLO_BURN_ALERT_PREFIX)}
    assert burns == {f"{rules.SLO_BURN_ALERT_PREFIX}{b.long_window}"
                     for b in rules.DEFAULT_BURN_WINDOWS}
    for alert in alerts:
        assert alert["labels"]["severity"] in {rules.SEVERITY_CRITICAL, rules.SEVERITY_WARNING}
        annotations = alert["annotations"]
        assert annotations["summary"] and annotations["description"]
        anchor = annotations["runbook_url"].split("#", 1)[1]
        assert anchor in anchors, anchor


def test_windows_and_thresholds_are_parameters() -> None:
    live = rules.RuleParams(rate_window="30s", hit_baselines=("1m",), hit_for="10s",
                            hit_min_input_tokens_per_second=1.0, evaluation_interval="5s")
    text = rules.rules_yaml(live)
    document = yaml.safe_load(text)
    records = [r["record"] for g in document["groups"] for r in g["rules"] if "record" in r]
    assert "model:tokenpath_prefix_cache_hit:ratio_rate30s" in records
    regression = next(r for g in document["groups"] for r in g["rules"]
                      if r.get("alert") == "TokenpathPrefixCacheHitRegression")
    assert "offset 1m" in regression["expr"] and "offset 1d" not in regression["expr"]
    assert regression["for"] == "10s"
    assert all(g["interval"] == "5s" for g in document["groups"])


@pytest.mark.parametrize("field,value", [("hit_relative_drop", 1.5), ("hit_baselines", ()),
                                         ("burn_windows", ()), ("cost_spike_factor", 1.0)])
def test_invalid_params_name_the_key(field: str, value: object) -> None:
    params = rules.RuleParams(**{field: value})  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as error:
        params.validate()
    assert error.value.key == field


def test_budget_rules_pass_promtool_check_and_their_tests_can_fail(tmp_path: Path) -> None:
    """The example budgets' rules are valid, and their unit test fails when acme's budget
    is so large that its spend no longer burns it."""
    promtool = _promtool()
    check = subprocess.run([promtool, "check", "rules",
                            str(REPO / generate.BUDGET_RULES_EXAMPLE_FILE)],
                           capture_output=True, text=True, timeout=60, check=False)
    assert check.returncode == 0 and "SUCCESS" in check.stdout, check.stdout + check.stderr
    generous = [b if b.tenant != "acme" else budgets.Budget("acme", 1e6, "day")
                for b in budgets.load_budgets(REPO / generate.BUDGETS_EXAMPLE)]
    (tmp_path / "tests").mkdir()
    test_name = "tokenpath-budgets.test.yml"
    shutil.copy(TESTS_DIR / test_name, tmp_path / "tests" / test_name)
    (tmp_path / generate.BUDGET_RULES_EXAMPLE_FILE.name).write_text(
        budgets.budget_rules_yaml(generous), "utf-8")
    result = subprocess.run([promtool, "test", "rules", test_name], cwd=tmp_path / "tests",
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode != 0
    assert "TokenpathTenantBudgetBurn1h" in result.stdout + result.stderr


def test_a_bad_budgets_file_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"budgets\.acme\.per"):
        budgets.parse_budgets({"budgets": {"acme": {"dollars": 5, "per": "week"}}})
    with pytest.raises(ConfigError, match=r"budgets\.acme\.dollars"):
        budgets.parse_budgets({"budgets": {"acme": {"dollars": -1}}})



def test_budgets_refuse_nan_and_names_yaml_reads_as_booleans() -> None:
    with pytest.raises(ConfigError, match=r"budgets\.acme\.dollars"):
        budgets.parse_budgets({"budgets": {"acme": {"dollars": float("nan")}}})
    with pytest.raises(ConfigError, match=r"budgets\.True"):
        budgets.parse_budgets(yaml.safe_load("budgets:\n  on: {dollars: 5}\n"))
