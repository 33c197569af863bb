"""Live: a real Prometheus (Debian package) scrapes a real `tokenpath collector` fed OTLP
request traces, evaluates every dashboard panel query and the generated rules with
minute-scale windows; switching the workload to unique prompts drops the hit ratio and the
cache-regression alert travels Prometheus -> Alertmanager -> a webhook receiver here.

Until the demo (2/9), cost attribution (4/9) and the agent (5/9) are on main, the traces
come from a synthetic workload (tests/dashboards/otlp_workload.py) and the agent and cost
metrics from a stand-in (tests/dashboards/standin_exporter.py).
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dashboards import prometheus_stack as stack
from tests.dashboards.otlp_workload import CollectorProcess, SpanWorkload
from tests.dashboards.standin_exporter import StandInExporter
from tokenpath import metric_names as mn
from tokenpath.dashboards import generate, rules
from tokenpath.dashboards import queries as q
from tokenpath.dashboards.definitions import VAR_BASELINE

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
COLLECTOR_JOB = "tokenpath-collector"
STANDIN_COST_JOB = "tokenpath-standin-cost"
MODEL = "live-model"
# Minute-scale rule parameters: same expressions as production, shorter windows.
LIVE_PARAMS = rules.RuleParams(
    evaluation_interval="1s", rate_window="10s", hit_baselines=("20s",), hit_for="3s",
    hit_min_input_tokens_per_second=100.0,
    burn_windows=(rules.BurnWindow("1m", "10s", 14.4, rules.SEVERITY_CRITICAL, "5s"),),
    cost_baseline_window="1m", cost_for="1m", miss_waste_for="1m", collector_for="1m")
# Grafana's variables as a dashboard user with "All" selected would send them.
TEMPLATE_VALUES = {
    "$__rate_interval": "10s",
    "$__range": "20s",
    f"${q.VAR_MODEL}": ".*",
    f"${q.VAR_POOL}": ".*",
    f"${VAR_BASELINE}": "10s",
}
WARMUP_SECONDS = 25.0
ALERT_TIMEOUT_SECONDS = 60.0
REGRESSION_ALERT = "TokenpathPrefixCacheHitRegression"


def _panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def _expand(expr: str) -> str:
    for variable, value in TEMPLATE_VALUES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, expr
    return expr


@pytest.fixture(scope="module")
def live_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    prometheus = stack.find_binary(stack.PROMETHEUS_BINARIES)
    alertmanager = stack.find_binary(stack.ALERTMANAGER_BINARIES)
    if prometheus is None or alertmanager is None:
        pytest.skip("Debian prometheus/prometheus-alertmanager not installed "
                    "(scripts/install-system-deps.sh installs them as root)")
    workdir = tmp_path_factory.mktemp("live-prometheus")
    rule_file = workdir / "rules.yml"
    rule_file.write_text(rules.rules_yaml(LIVE_PARAMS), encoding="utf-8")
    collector = CollectorProcess(workdir, "collector")
    workload = SpanWorkload(collector.http_url, MODEL)
    source = StandInExporter(MODEL)
    webhook = stack.WebhookReceiver()
    processes: list[stack.ManagedProcess] = []
    try:
        collector.wait_ready()
        workload.start()
        source.start()
        webhook.start()
        am_process, am_url = stack.start_alertmanager(alertmanager, workdir, webhook.url)
        processes.append(am_process)
        prom_process, prom_url = stack.start_prometheus(
            prometheus, workdir,
            {COLLECTOR_JOB: [collector.http_url.removeprefix("http://")],
             STANDIN_COST_JOB: [f"127.0.0.1:{source.cost_port}"],
             LIVE_PARAMS.agent_job: [f"127.0.0.1:{source.agent_port}"]},
            rule_file, am_url)
        processes.append(prom_process)
        time.sleep(WARMUP_SECONDS)
        yield {"prometheus": prom_url, "alertmanager": am_url, "workload": workload,
               "webhook": webhook, "workdir": workdir}
    finally:
        for process in reversed(processes):
            process.stop()
        webhook.shutdown()
        source.shutdown()
        workload.shutdown()
        collector.stop()


def test_every_dashboard_panel_query_returns_data(live_stack: dict[str, Any]) -> None:
    url = live_stack["prometheus"]
    failures: list[str] = []
    checked = 0
    for path in sorted((REPO / generate.GRAFANA_DIR).glob("*.json")):
        board = json.loads(path.read_text(encoding="utf-8"))
        for panel in _panels(board):
            for target in panel.get("targets", []):
                expr = _expand(target["expr"])
                reply = stack.instant_query(url, expr)
                checked += 1
                if reply.get("status") != "success":
                    failures.append(f"{path.name} / {panel['title']}: error {reply}")
                elif not reply["data"]["result"]:
                    failures.append(f"{path.name} / {panel['title']}: no data for {expr}")
        for variable in board["templating"]["list"]:
            match = re.fullmatch(r"label_values\((\w+), (\w+)\)", str(variable.get("query")))
            if match:
                metric, label = match.groups()
                values = stack.http_json(
                    f"{url}/api/v1/label/{label}/values?"
                    + urllib.parse.urlencode({"match[]": metric}))
                if not values["data"]:
                    failures.append(f"{path.name}: variable {variable['name']} has no values")
    assert checked > 0
    assert failures == []


def test_request_metrics_come_from_the_real_collector(live_stack: dict[str, Any]) -> None:
    for spec in (mn.TOKENS, mn.REQUESTS):
        reply = stack.instant_query(live_stack["prometheus"],
                                    f"count by ({mn.LABEL_JOB}) ({spec.series})")
        jobs = {r["metric"][mn.LABEL_JOB] for r in reply["data"]["result"]}
        assert jobs == {COLLECTOR_JOB}, spec.name


def test_recording_rules_evaluate(live_stack: dict[str, Any]) -> None:
    reply = stack.instant_query(live_stack["prometheus"], rules.hit_ratio_series(LIVE_PARAMS))
    assert reply["status"] == "success"
    values = {r["metric"]["model"]: float(r["value"][1]) for r in reply["data"]["result"]}
    assert values[MODEL] == pytest.approx(0.8, abs=0.01)


def test_unique_prompts_fire_the_cache_regression_alert_to_the_webhook(
        live_stack: dict[str, Any]) -> None:
    workload: SpanWorkload = live_stack["workload"]
    webhook: stack.WebhookReceiver = live_stack["webhook"]
    assert not [a for a in webhook.alerts() if a["labels"]["alertname"] == REGRESSION_ALERT]
    workload.unique_prompts.set()
    deadline = time.monotonic() + ALERT_TIMEOUT_SECONDS
    received: list[dict[str, Any]] = []
    while time.monotonic() < deadline and not received:
        time.sleep(1.0)
        received = [a for a in webhook.alerts()
                    if a["labels"]["alertname"] == REGRESSION_ALERT]
    assert received, (f"no {REGRESSION_ALERT} at the webhook; Prometheus alerts: "
                      f"{stack.http_json(live_stack['prometheus'] + '/api/v1/alerts')}")
    alert = received[0]
    assert alert["status"] == "firing"
    assert alert["labels"]["model"] == MODEL
    assert alert["labels"]["severity"] == rules.SEVERITY_WARNING
    assert alert["annotations"]["runbook_url"].endswith("#prefix-cache-hit-regression")
    now = stack.instant_query(live_stack["prometheus"], rules.hit_ratio_series(LIVE_PARAMS))
    assert float(now["data"]["result"][0]["value"][1]) < 0.8 * (1 - LIVE_PARAMS.hit_relative_drop)
