"""Live: the SLO burn-rate alert on a real Prometheus (Debian package) scraping a
`tokenpath demo`'s collector. The demo's interactive class is held to a TTFT its normal
load meets and an objective of 99.9 %; the demo is then slowed (five times the load on one
replica instead of three: requests queue), its interactive requests miss, and the fast
burn-rate alert fires; back at the normal load it resolves, with the class's error ratio
still on record (the alert resolved on data, not on a missing target).

The generated rules with second-scale windows (the production expressions). The demo
cannot change its load mid-run, so each phase is its own `tokenpath demo` on the same
ports and store (Prometheus's rate() handles the counters' restart)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.dashboards import prometheus_stack as stack
from tests.dashboards.demo_process import REQUESTS_PER_SECOND, DemoPorts, DemoProcess
from tokenpath import metric_names as mn
from tokenpath.dashboards import rules
from tokenpath.slo import CONFIG_KEY

pytestmark = pytest.mark.integration

COLLECTOR_JOB = "tokenpath-collector"
BURN = rules.BurnWindow("30s", "5s", 14.4, rules.SEVERITY_CRITICAL, "2s")
PARAMS = rules.RuleParams(evaluation_interval="1s", rate_window="15s", burn_windows=(BURN,))
ALERT = f"{rules.SLO_BURN_ALERT_PREFIX}{BURN.long_window}"
SLO_CLASS = "interactive"
# At time scale 1 (the demo scales them with its clock): the normal demo's slowest first
# token is about 4 s (its long-context tail); five times the load on one replica queues
# past 6 s within seconds. 99.9 %: a 0.1 % budget, 1.44 % of requests at 14.4x.
CLASSES = [
    {"name": SLO_CLASS, "match": {"tenant": "acme"}, "ttft_seconds": 6.0,
     "objective": 0.999},
    {"name": "batch", "ttft_seconds": 60.0, "objective": 0.9},
]
SLOW_ARGS = ("--rps", str(REQUESTS_PER_SECOND * 5), "--replicas", "1")
TIMEOUT_SECONDS = 120.0  # a hang, not a speed check: the test waits for conditions


class SloStack:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.ports = DemoPorts(collector=stack.free_port(), agent=stack.free_port())
        self.store = workdir / "demo-store.db"
        self.classes = workdir / "slo.yml"
        self.classes.write_text(yaml.safe_dump({CONFIG_KEY: CLASSES}), encoding="utf-8")
        self.demo: DemoProcess | None = None
        self.phases = 0
        self.processes: list[stack.ManagedProcess] = []
        self.prometheus = ""

    def run_demo(self, extra: tuple[str, ...] = ()) -> None:
        """Stop the running demo phase (it must exit cleanly) and start the next."""
        if self.demo is not None:
            assert self.demo.stop() == 0, self.demo.output()[-3000:]
        self.phases += 1
        self.demo = DemoProcess(self.workdir, f"demo-{self.phases}", self.ports, self.store,
                                0.7, seed=7 + self.phases,
                                extra_args=("--slo-classes", str(self.classes), *extra))
        self.demo.start()

    def firing(self) -> list[dict[str, Any]]:
        return [a for a in stack.http_json(f"{self.prometheus}/api/v1/alerts")["data"]["alerts"]
                if a["labels"].get("alertname") == ALERT and a["state"] == "firing"]

    def error_ratio(self) -> list[dict[str, Any]]:
        series = rules.slo_errors_series(BURN.short_window)
        return stack.values(self.prometheus, f'{series}{{{mn.LABEL_SLO}="{SLO_CLASS}"}}')

    def detail(self) -> str:
        ratio = self.error_ratio()
        log = self.demo.output()[-1500:] if self.demo is not None else ""
        return f"error ratio {ratio}; alerts {self.firing()}; demo log: {log}"

    def stop(self) -> None:
        if self.demo is not None:
            self.demo.stop()
        for process in reversed(self.processes):
            process.stop()


@pytest.fixture
def slo_stack(tmp_path: Path) -> Iterator[SloStack]:
    prometheus = stack.find_binary(stack.PROMETHEUS_BINARIES)
    if prometheus is None:
        pytest.skip("Debian prometheus not installed "
                    "(scripts/install-system-deps.sh installs it as root)")
    rule_file = tmp_path / "rules.yml"
    rule_file.write_text(rules.rules_yaml(PARAMS), encoding="utf-8")
    running = SloStack(tmp_path)
    try:
        running.run_demo()
        # no Alertmanager: the alert's state is read from Prometheus itself
        process, running.prometheus = stack.start_prometheus(
            prometheus, tmp_path, {COLLECTOR_JOB: [f"127.0.0.1:{running.ports.collector}"]},
            rule_file, f"http://127.0.0.1:{stack.free_port()}")
        running.processes.append(process)
        yield running
    finally:
        running.stop()


def test_the_burn_rate_alert_fires_when_the_engine_is_slowed_and_resolves_after(
        slo_stack: SloStack) -> None:
    live = slo_stack
    objective = f'{mn.SLO_OBJECTIVE.series}{{{mn.LABEL_SLO}="{SLO_CLASS}"}}'
    stack.poll("the class's objective and error ratio on record", TIMEOUT_SECONDS,
               lambda: bool(stack.values(live.prometheus, objective)) and bool(live.error_ratio()),
               live.detail)
    assert float(stack.values(live.prometheus, objective)[0]["value"][1]) == 0.999
    # the normal load meets the targets: nothing fires
    assert live.firing() == [], live.detail()

    live.run_demo(SLOW_ARGS)
    stack.poll(f"{ALERT} firing under the slowed engine", TIMEOUT_SECONDS,
               lambda: bool(live.firing()),
               live.detail)
    (alert,) = live.firing()
    assert alert["labels"][mn.LABEL_SLO] == SLO_CLASS
    assert alert["labels"]["severity"] == rules.SEVERITY_CRITICAL
    assert alert["annotations"]["runbook_url"].endswith("#slo-burn")

    live.run_demo()

    def resolved() -> bool:  # on data: the short window's ratio is there, under budget
        ratio = live.error_ratio()
        return not live.firing() and bool(ratio) and float(ratio[0]["value"][1]) < (
            BURN.burn_rate * (1 - 0.999))

    stack.poll(f"{ALERT} resolved at the normal load", TIMEOUT_SECONDS, resolved, live.detail)
