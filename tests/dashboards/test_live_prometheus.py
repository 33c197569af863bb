"""Live: a real Prometheus (Debian package) scrapes a `tokenpath demo`'s collector and node
agent, evaluates every dashboard panel query and the generated rules with second-scale
windows; switching the workload to unique prompts drops the hit ratio and the
cache-regression alert travels Prometheus -> Alertmanager -> a webhook receiver here.

The demo runs as a subprocess (simulated engine, time-scaled). Phase 1 shares system
prompts (``--shared-prefix 1``). The demo cannot change its workload mid-run, so the switch
is a second `tokenpath demo` with ``--shared-prefix 0`` (unique system prompts) on the same
collector and agent ports and the same store: the same scrape targets, whose counters
restart (Prometheus's rate() handles the reset).
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
from tests.dashboards.demo_process import DemoPorts, DemoProcess
from tokenpath import metric_names as mn
from tokenpath.dashboards import budgets, generate, rules
from tokenpath.dashboards import queries as q
from tokenpath.dashboards.definitions import VAR_BASELINE
from tokenpath.instrumentation.reference.engine import DEFAULT_POOL

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
COLLECTOR_JOB = "tokenpath-collector"
SHARED_PHASE_PREFIX = 1.0
UNIQUE_PHASE_PREFIX = 0.0
# Second-scale rule parameters: the production expressions with shorter windows. The
# 15 s rate window smooths the demo's long-context tail (5 % of requests with thousands
# of uncached tokens) so the shared phase does not page by itself. After the switch the
# new demo's first records reach Prometheus about 10 s later (start-up, then the
# collector's 6 s root grace); the 45 s baseline still looks at the shared phase for
# about 30 s after that, the alert's window.
LIVE_PARAMS = rules.RuleParams(
    evaluation_interval="1s", rate_window="15s", hit_baselines=("45s",), hit_for="3s",
    hit_min_input_tokens_per_second=100.0,
    burn_windows=(rules.BurnWindow("1m", "10s", 14.4, rules.SEVERITY_CRITICAL, "5s"),),
    cost_baseline_window="1m", cost_for="1m", miss_waste_for="1m", collector_for="1m")
# Grafana's variables as a dashboard user with "All" selected would send them.
RANGE_SECONDS = 20
BASELINE_SECONDS = 10
TEMPLATE_VALUES = {
    "$__rate_interval": "10s",
    "$__range": f"{RANGE_SECONDS}s",
    f"${q.VAR_MODEL}": ".*",
    f"${q.VAR_POOL}": ".*",
    f"${VAR_BASELINE}": f"{BASELINE_SECONDS}s",
}
# Scrapes (1 s apart) of the collector before the panels are checked: the longest range
# plus offset a panel looks back over, and a margin.
WARMUP_SCRAPES = RANGE_SECONDS + BASELINE_SECONDS + 3
WARMUP_TIMEOUT_SECONDS = 90.0
PANEL_RETRY_SECONDS = 20.0
BASELINE_TIMEOUT_SECONDS = 90.0
ALERT_TIMEOUT_SECONDS = 90.0
REGRESSION_ALERT = "TokenpathPrefixCacheHitRegression"
# The demo's tenants (tokenpath/cli/demo_cmd.py): acme's budget is a cent a day, which its
# share of the demo's spend burns thousands of times over; the others' are unlimited.
OVERSPENDING_TENANT = "acme"
LIVE_BUDGETS = [budgets.Budget(OVERSPENDING_TENANT, 0.01, "day"),
                budgets.Budget("globex", 1e9, "day"), budgets.Budget("initech", 1e9, "day")]
BUDGET_ALERT = f"{budgets.BUDGET_ALERT_PREFIX}{LIVE_PARAMS.burn_windows[0].long_window}"
# Panels that read only NVML metrics: with no NVIDIA GPU and driver the real agent reports
# tokenpath_agent_nvml_up 0 and exports none of these, so their panels have no data here.
# They are exempt only while the agent says NVML is down; on a GPU machine they must
# return data like every other panel.
NVML_METRICS = frozenset(spec.name for spec in (
    mn.GPU_UTILIZATION, mn.GPU_MEMORY_USED, mn.GPU_MEMORY_TOTAL, mn.GPU_MEMORY_BW_UTIL,
    mn.GPU_POWER, mn.GPU_SM_CLOCK, mn.GPU_BUSY_SECONDS))
# The live stack's demo serves with engines that prefill and decode alike: no request of
# it crosses from a prefill engine to a decode engine, so the KV-transfer panels have no
# data here (the disaggregated reference path's test reads the collector's counter:
# tests/instrumentation/reference/test_disaggregated.py).
DISAGGREGATED_METRICS = frozenset({mn.KV_TRANSFER_BYTES.series})
METRIC_NAME = re.compile(rf"\b{mn.NAMESPACE}_[a-z0-9_]+")


def _panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def _expand(expr: str) -> str:
    for variable, value in TEMPLATE_VALUES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, expr
    return expr


class LiveStack:
    """The running parts; :meth:`switch_to_unique_prompts` replaces the demo phase."""

    def __init__(self, workdir: Path, ports: DemoPorts) -> None:
        self.workdir = workdir
        self.ports = ports
        self.store = workdir / "demo-store.db"
        self.shared = DemoProcess(workdir, "demo-shared", ports, self.store,
                                  SHARED_PHASE_PREFIX, seed=7)
        self.unique: DemoProcess | None = None
        self.webhook = stack.WebhookReceiver()
        self.processes: list[stack.ManagedProcess] = []
        self.prometheus = ""
        self.alertmanager = ""

    def switch_to_unique_prompts(self) -> int | None:
        """Stop the shared-prefix demo (its exit status) and start the unique-prompt one."""
        status = self.shared.stop()
        self.unique = DemoProcess(self.workdir, "demo-unique", self.ports, self.store,
                                  UNIQUE_PHASE_PREFIX, seed=8)
        self.unique.start()
        return status

    def regression_alerts(self) -> list[dict[str, Any]]:
        return [a for a in self.webhook.alerts()
                if a["labels"]["alertname"] == REGRESSION_ALERT]

    def stop(self) -> None:
        for demo in (self.unique, self.shared):
            if demo is not None:
                demo.stop()
        for process in reversed(self.processes):
            process.stop()
        self.webhook.shutdown()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    prometheus = stack.find_binary(stack.PROMETHEUS_BINARIES)
    alertmanager = stack.find_binary(stack.ALERTMANAGER_BINARIES)
    if prometheus is None or alertmanager is None:
        pytest.skip("Debian prometheus/prometheus-alertmanager not installed "
                    "(scripts/install-system-deps.sh installs them as root)")
    workdir = tmp_path_factory.mktemp("live-prometheus")
    rule_file = workdir / "rules.yml"
    document = rules.rule_groups(LIVE_PARAMS)
    document["groups"].append(budgets.budget_group(LIVE_BUDGETS, LIVE_PARAMS))
    rule_file.write_text(rules.to_yaml(document), encoding="utf-8")
    ports = DemoPorts(collector=stack.free_port(), agent=stack.free_port())
    live = LiveStack(workdir, ports)
    try:
        live.shared.start()
        live.webhook.start()
        am_process, live.alertmanager = stack.start_alertmanager(
            alertmanager, workdir, live.webhook.url)
        live.processes.append(am_process)
        # as deploy/compose/prometheus.yml: the agent's target carries the node's pool
        prom_process, live.prometheus = stack.start_prometheus(
            prometheus, workdir,
            {COLLECTOR_JOB: [f"127.0.0.1:{ports.collector}"],
             LIVE_PARAMS.agent_job: [f"127.0.0.1:{ports.agent}"]},
            rule_file, live.alertmanager,
            target_labels={LIVE_PARAMS.agent_job: {mn.LABEL_POOL: DEFAULT_POOL}})
        live.processes.append(prom_process)
        scrapes = (f"count_over_time({mn.UP_SERIES}{{{mn.LABEL_JOB}=\"{COLLECTOR_JOB}\"}}"
                   f"[{2 * WARMUP_SCRAPES}s]) >= {WARMUP_SCRAPES}")
        stack.poll(f"{WARMUP_SCRAPES} scrapes of the demo's collector", WARMUP_TIMEOUT_SECONDS,
                   lambda: bool(stack.values(live.prometheus, scrapes)), live.shared.output)
        yield live
    finally:
        live.stop()


def _panel_failures(prometheus: str, nvml_up: bool) -> tuple[list[str], list[str], int]:
    """(failures, exempt panels with no data, targets checked) over the committed JSON."""
    failures: list[str] = []
    exempt: list[str] = []
    checked = 0
    for path in sorted((REPO / generate.GRAFANA_DIR).glob("*.json")):
        board = json.loads(path.read_text(encoding="utf-8"))
        for panel in _panels(board):
            for target in panel.get("targets", []):
                expr = _expand(target["expr"])
                reply = stack.instant_query(prometheus, expr)
                checked += 1
                where = f"{path.name} / {panel['title']}"
                if reply.get("status") != "success":
                    failures.append(f"{where}: error {reply}")
                elif not reply["data"]["result"]:
                    names = set(METRIC_NAME.findall(expr))
                    if (not nvml_up and names <= NVML_METRICS) or names <= DISAGGREGATED_METRICS:
                        exempt.append(where)
                    else:
                        failures.append(f"{where}: no data for {expr}")
        for variable in board["templating"]["list"]:
            match = re.fullmatch(r"label_values\((\w+), (\w+)\)", str(variable.get("query")))
            if match:
                metric, label = match.groups()
                values = stack.http_json(
                    f"{prometheus}/api/v1/label/{label}/values?"
                    + urllib.parse.urlencode({"match[]": metric}))
                if not values["data"]:
                    failures.append(f"{path.name}: variable {variable['name']} has no values")
    return failures, exempt, checked


def test_every_dashboard_panel_query_returns_data(live: LiveStack) -> None:
    nvml = stack.values(live.prometheus, mn.AGENT_NVML_UP.series)
    assert nvml, "the demo's agent exports no NVML status"
    nvml_up = float(nvml[0]["value"][1]) == 1.0
    # a scrape or rule evaluation may land late on a loaded machine: retry briefly
    deadline = time.monotonic() + PANEL_RETRY_SECONDS
    failures, exempt, checked = _panel_failures(live.prometheus, nvml_up)
    while failures and time.monotonic() < deadline:
        time.sleep(2.0)
        failures, exempt, checked = _panel_failures(live.prometheus, nvml_up)
    assert checked > 0
    assert failures == []
    if nvml_up:
        assert exempt == []
    else:  # exactly the GPU panels of the Nodes dashboard, nothing else slipped through
        assert exempt and all(where.startswith("nodes.json / ") for where in exempt), exempt


def test_metrics_come_from_the_demos_collector_and_agent(live: LiveStack) -> None:
    for spec, job in ((mn.TOKENS, COLLECTOR_JOB), (mn.REQUESTS, COLLECTOR_JOB),
                      (mn.COST, COLLECTOR_JOB), (mn.IDLE_COST, COLLECTOR_JOB),
                      (mn.LONG_CONTEXT_COST, COLLECTOR_JOB),
                      (mn.NODE_NET_RX_BYTES, LIVE_PARAMS.agent_job),
                      (mn.AGENT_NVML_UP, LIVE_PARAMS.agent_job)):
        result = stack.values(live.prometheus, f"count by ({mn.LABEL_JOB}) ({spec.series})")
        assert {r["metric"][mn.LABEL_JOB] for r in result} == {job}, spec.name


def test_recording_rules_evaluate(live: LiveStack) -> None:
    result = stack.values(live.prometheus, rules.hit_ratio_series(LIVE_PARAMS))
    ratios = {r["metric"][mn.LABEL_MODEL]: float(r["value"][1]) for r in result}
    assert len(ratios) == 1
    # shared system prompts: most input tokens come from the prefix cache (about 0.7)
    assert 0.4 < next(iter(ratios.values())) < 1.0
    for series in (rules.input_rate_series(LIVE_PARAMS), rules.output_rate_series(LIVE_PARAMS),
                   rules.miss_waste_series(LIVE_PARAMS),
                   rules.cost_per_token_series(LIVE_PARAMS.rate_window)):
        assert stack.values(live.prometheus, series), series


def test_unique_prompts_fire_the_cache_regression_alert_to_the_webhook(
        live: LiveStack) -> None:
    ratio = rules.hit_ratio_series(LIVE_PARAMS)
    baseline = q.offset(ratio, LIVE_PARAMS.hit_baselines[0])
    stack.poll(f"the {LIVE_PARAMS.hit_baselines[0]} baseline", BASELINE_TIMEOUT_SECONDS,
               lambda: bool(stack.values(live.prometheus, baseline)))
    assert live.regression_alerts() == []  # the shared-prefix phase does not page
    before = float(stack.values(live.prometheus, ratio)[0]["value"][1])

    assert live.switch_to_unique_prompts() == 0  # interrupted, printed its report
    assert "prefix-cache hit ratio" in live.shared.output()
    stack.poll(f"{REGRESSION_ALERT} at the webhook", ALERT_TIMEOUT_SECONDS,
               lambda: bool(live.regression_alerts()),
               lambda: "Prometheus alerts: "
                       f"{stack.http_json(live.prometheus + '/api/v1/alerts')}")
    alert = live.regression_alerts()[0]
    assert alert["status"] == "firing"
    model = alert["labels"][mn.LABEL_MODEL]
    assert model in live.shared.output()  # the demo's model, as its banner names it
    assert alert["labels"]["severity"] == rules.SEVERITY_WARNING
    assert alert["annotations"]["runbook_url"].endswith("#prefix-cache-hit-regression")
    after = float(stack.values(live.prometheus, ratio)[0]["value"][1])
    assert after < (1 - LIVE_PARAMS.hit_relative_drop) * before


def test_an_overspending_tenant_fires_its_budget_alert_and_the_others_do_not(
        live: LiveStack) -> None:
    """The demo's tenants spend at their shares; only acme's budget is burnt, and its
    burn-rate alert reaches the webhook through Alertmanager."""
    def budget_alerts() -> list[dict[str, Any]]:
        return [a for a in live.webhook.alerts() if a["labels"]["alertname"] == BUDGET_ALERT]

    stack.poll(f"{BUDGET_ALERT} at the webhook", ALERT_TIMEOUT_SECONDS,
               lambda: bool(budget_alerts()),
               lambda: "Prometheus alerts: "
                       f"{stack.http_json(live.prometheus + '/api/v1/alerts')}")
    assert {a["labels"][mn.LABEL_TENANT] for a in budget_alerts()} == {OVERSPENDING_TENANT}
    assert budget_alerts()[0]["annotations"]["runbook_url"].endswith(
        f"#{budgets.BUDGET_RUNBOOK_ANCHOR}")
    firing = stack.http_json(live.prometheus + "/api/v1/alerts")["data"]["alerts"]
    tenants = {a["labels"].get(mn.LABEL_TENANT) for a in firing
               if a["labels"]["alertname"] == BUDGET_ALERT}
    assert tenants == {OVERSPENDING_TENANT}  # globex and initech spend within budget

