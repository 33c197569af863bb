"""Prometheus recording and alert rules, generated from code.

Windows and thresholds are parameters (``RuleParams``): production uses hours and days,
the live test uses seconds and minutes with the same expressions. Recording rules follow
``level:metric:operations`` (e.g. ``model:tokenpath_prefix_cache_hit:ratio_rate5m``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from tokenpath import metric_names as mn
from tokenpath.config import check, validate_fields
from tokenpath.dashboards import queries as q
from tokenpath.slo import OUTCOME_MET, OUTCOME_MISSED

SEVERITY_CRITICAL = "critical"
SEVERITY_WARNING = "warning"
RECORDING_GROUP = "tokenpath-recording"
ALERT_GROUP = "tokenpath-alerts"
DEFAULT_RUNBOOK_BASE_URL = "docs/runbooks.md"
SLO_BURN_ALERT_PREFIX = "TokenpathSLOBudgetBurn"


@dataclass(frozen=True, slots=True)
class BurnWindow:
    """One multiwindow burn-rate condition: both windows above ``burn_rate``."""

    long_window: str
    short_window: str
    burn_rate: float
    severity: str
    for_: str


DEFAULT_BURN_WINDOWS: tuple[BurnWindow, ...] = (
    BurnWindow("1h", "5m", 14.4, SEVERITY_CRITICAL, "2m"),
    BurnWindow("6h", "30m", 6.0, SEVERITY_WARNING, "15m"),
)


@dataclass(frozen=True, slots=True)
class RuleParams:
    """Windows and thresholds of every rule; defaults are the production values."""

    evaluation_interval: str = "1m"
    rate_window: str = "5m"
    # Prefix-cache hit regression: now below (1 - drop) x the ratio at each baseline offset.
    hit_baselines: tuple[str, ...] = field(default=("1h", "1d"), metadata=check(
        non_empty=True, message="at least one baseline offset is needed"))
    hit_relative_drop: float = field(default=0.25, metadata=check(
        gt=0.0, lt=1.0, message="must be between 0 and 1"))
    hit_min_input_tokens_per_second: float = 50.0
    hit_for: str = "15m"
    # SLO burn rates (every class of the collector's slo_classes, each against its own
    # objective, tokenpath_slo_objective_ratio): both windows of a BurnWindow above its rate.
    burn_windows: tuple[BurnWindow, ...] = field(default=DEFAULT_BURN_WINDOWS, metadata=check(
        non_empty=True, message="at least one burn window is needed"))
    # Cost per output token against its own long-window average.
    cost_baseline_window: str = "1d"
    cost_spike_factor: float = field(default=1.5,
                                     metadata=check(gt=1.0, message="must be above 1"))
    cost_min_output_tokens_per_second: float = 5.0
    cost_for: str = "30m"
    miss_waste_dollars_per_hour: float = 5.0
    miss_waste_for: str = "30m"
    collector_drop_per_second: float = 0.0
    collector_evict_per_second: float = 0.1
    collector_for: str = "10m"
    agent_job: str = "tokenpath-agent"
    agent_down_for: str = "5m"
    nvml_down_for: str = "10m"
    runbook_base_url: str = DEFAULT_RUNBOOK_BASE_URL
    extra_alert_labels: dict[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        validate_fields(self)


# Recorded series names (level:metric:operations).
def _name(level: str, metric: str, operations: str) -> str:
    return f"{level}:{metric}:{operations}"


MODEL_LEVEL = mn.LABEL_MODEL
HIT_METRIC = f"{mn.NAMESPACE}_prefix_cache_hit"
INPUT_TOKENS_METRIC = f"{mn.TOKENS.name}_{mn.TOKEN_KIND_INPUT}"
OUTPUT_TOKENS_METRIC = f"{mn.TOKENS.name}_{mn.TOKEN_KIND_OUTPUT}"
COST_PER_TOKEN_METRIC = f"{mn.COST.name}_per_output_token"
SLO_LEVEL = mn.LABEL_SLO
SLO_ERRORS_METRIC = f"{mn.NAMESPACE}_slo_errors"


def hit_ratio_series(params: RuleParams) -> str:
    return _name(MODEL_LEVEL, HIT_METRIC, f"ratio_rate{params.rate_window}")


def input_rate_series(params: RuleParams) -> str:
    return _name(MODEL_LEVEL, INPUT_TOKENS_METRIC, f"rate{params.rate_window}")


def output_rate_series(params: RuleParams) -> str:
    return _name(MODEL_LEVEL, OUTPUT_TOKENS_METRIC, f"rate{params.rate_window}")


def cost_per_token_series(window: str) -> str:
    return _name(MODEL_LEVEL, COST_PER_TOKEN_METRIC, f"ratio_rate{window}")


def miss_waste_series(params: RuleParams) -> str:
    return _name(MODEL_LEVEL, mn.CACHE_MISS_WASTE.name, f"rate{params.rate_window}")


def slo_errors_series(window: str) -> str:
    """Per SLO class, missed / (met + missed) requests over ``window`` (unknown outcomes
    are neither)."""
    return _name(SLO_LEVEL, SLO_ERRORS_METRIC, f"ratio_rate{window}")


def slo_errors_expr(window: str) -> str:
    by = (mn.LABEL_SLO,)
    series = mn.SLO_REQUESTS.series
    missed = q.sum_rate(series, window, (q.eq(mn.LABEL_OUTCOME, OUTCOME_MISSED),), by)
    judged = q.sum_rate(series, window,
                        (f'{mn.LABEL_OUTCOME}=~"{OUTCOME_MET}|{OUTCOME_MISSED}"',), by)
    return f"{missed}\n/\n{judged}"


def slo_budget_expr(burn_rate: float) -> str:
    """``burn_rate`` times each class's error budget (1 - its objective, as the collectors
    export it; the same on every replica, so max collapses the replicas)."""
    return (f"{burn_rate:g} * (1 - max by ({mn.LABEL_SLO}) "
            f"({mn.SLO_OBJECTIVE.series}))")


def _burn_windows(params: RuleParams) -> list[str]:
    windows: list[str] = []
    for burn in params.burn_windows:
        for window in (burn.short_window, burn.long_window):
            if window not in windows:
                windows.append(window)
    return windows


def recording_rules(params: RuleParams) -> list[dict[str, Any]]:
    by = (mn.LABEL_MODEL,)
    w = params.rate_window
    rules: list[dict[str, Any]] = [
        {"record": hit_ratio_series(params), "expr": q.prefix_cache_hit_ratio(w, by=by)},
        {"record": input_rate_series(params),
         "expr": q.token_rate(mn.TOKEN_KIND_INPUT, w, by=by)},
        {"record": output_rate_series(params),
         "expr": q.token_rate(mn.TOKEN_KIND_OUTPUT, w, by=by)},
        {"record": miss_waste_series(params),
         "expr": q.sum_rate(mn.CACHE_MISS_WASTE.series, w, by=by)},
    ]
    for window in (w, params.cost_baseline_window):
        rules.append({"record": cost_per_token_series(window),
                      "expr": (f"{q.sum_rate(mn.COST.series, window, by=by)}\n/\n"
                               f"{q.token_rate(mn.TOKEN_KIND_OUTPUT, window, by=by)}")})
    for window in _burn_windows(params):
        rules.append({"record": slo_errors_series(window), "expr": slo_errors_expr(window)})
    return rules


def _runbook(params: RuleParams, anchor: str) -> str:
    return f"{params.runbook_base_url}#{anchor}"


def alert_rule(params: RuleParams, name: str, expr: str, for_: str, severity: str,
           summary: str, description: str, anchor: str) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity, **params.extra_alert_labels},
        "annotations": {"summary": summary, "description": description,
                        "runbook_url": _runbook(params, anchor)},
    }


def _hit_regression_expr(params: RuleParams) -> str:
    now = hit_ratio_series(params)
    keep = 1.0 - params.hit_relative_drop
    drops = [f"{now} < on({mn.LABEL_MODEL}) {keep:g} * ({q.offset(now, baseline)})"
             for baseline in params.hit_baselines]
    regressed = "\nor\n".join(f"({drop})" for drop in drops)
    guard = (f"on({mn.LABEL_MODEL}) {input_rate_series(params)} "
             f"> {params.hit_min_input_tokens_per_second:g}")
    return f"(\n{regressed}\n)\nand {guard}"


def _burn_expr(burn: BurnWindow) -> str:
    on = f"on({mn.LABEL_SLO})"
    threshold = slo_budget_expr(burn.burn_rate)
    return (f"{slo_errors_series(burn.long_window)}\n> {on} {threshold}\n"
            f"and {on}\n"
            f"{slo_errors_series(burn.short_window)}\n> {on} {threshold}")


def measured_cause_note(params: RuleParams) -> str:
    """Alert-template text naming the cause the engines' KV-cache events measure for most
    of a model's recomputed tokens (the node agent's tokenpath_kv_recomputed_tokens_total);
    empty where no agent receives them."""
    query = (f"topk(1, sum by ({mn.LABEL_CAUSE}) (rate({mn.KV_RECOMPUTED_TOKENS.series}"
             f"{{{mn.LABEL_MODEL}=%q}}[{params.rate_window}])) > 0)")
    return (f'{{{{ with query (printf "{query}" $labels.{mn.LABEL_MODEL}) }}}}'
            "{{ with index . 0 }} The engines' KV-cache events measure most recomputed "
            "tokens as {{ .Labels.cause }} ({{ .Value | humanize }} tokens/s)."
            "{{ end }}{{ end }}")


def alert_rules(params: RuleParams) -> list[dict[str, Any]]:
    model = f"{{{{ $labels.{mn.LABEL_MODEL} }}}}"
    instance = f"{{{{ $labels.{mn.LABEL_INSTANCE} }}}}"
    value = "{{ $value | humanize }}"
    percent = "{{ $value | humanizePercentage }}"
    dollars = '{{ $value | printf "%.4g" }}'
    baselines = " and ".join(params.hit_baselines)
    alerts = [alert_rule(
        params, "TokenpathPrefixCacheHitRegression", _hit_regression_expr(params),
        params.hit_for, SEVERITY_WARNING,
        f"Prefix-cache hit ratio of {model} dropped",
        f"Token-weighted hit ratio of {model} is {percent}, more than "
        f"{params.hit_relative_drop:.0%} below its value {baselines} ago, with over "
        f"{params.hit_min_input_tokens_per_second:g} input tokens/s."
        + measured_cause_note(params),
        "prefix-cache-hit-regression")]
    slo = f"{{{{ $labels.{mn.LABEL_SLO} }}}}"
    for burn in params.burn_windows:
        alerts.append(alert_rule(
            params, f"{SLO_BURN_ALERT_PREFIX}{burn.long_window}", _burn_expr(burn),
            burn.for_, burn.severity,
            f"SLO class {slo} burning {burn.burn_rate:g}x its error budget",
            f"Over {burn.long_window} and {burn.short_window}, the share of {slo} requests "
            f"missing their targets is above {burn.burn_rate:g}x the class's error budget "
            f"(1 - its objective); over {burn.long_window} it is {percent}.",
            "slo-burn"))
    now_cost = cost_per_token_series(params.rate_window)
    by_instance_reason = (mn.LABEL_INSTANCE, mn.LABEL_REASON)
    dropped = q.sum_rate(mn.SPANS_DROPPED.series, params.rate_window, by=by_instance_reason)
    evicted = q.sum_rate(mn.TRACES_EVICTED.series, params.rate_window, by=by_instance_reason)
    alerts += [
        alert_rule(params, "TokenpathCostPerTokenSpike",
               f"{now_cost}\n> on({mn.LABEL_MODEL}) {params.cost_spike_factor:g} * "
               f"{cost_per_token_series(params.cost_baseline_window)}\n"
               f"and on({mn.LABEL_MODEL}) {output_rate_series(params)} "
               f"> {params.cost_min_output_tokens_per_second:g}",
               params.cost_for, SEVERITY_WARNING,
               f"Cost per output token of {model} spiked",
               f"Dollars per output token of {model} are {dollars}, over "
               f"{params.cost_spike_factor:g}x the {params.cost_baseline_window} average.",
               "cost-per-token-spike"),
        alert_rule(params, "TokenpathCacheMissWasteHigh",
               f"{q.SECONDS_PER_HOUR} * {miss_waste_series(params)} "
               f"> {params.miss_waste_dollars_per_hour:g}",
               params.miss_waste_for, SEVERITY_WARNING,
               f"Prefix-cache misses of {model} waste money",
               f"{model} spends ${value}/h recomputing prefixes seen recently "
               f"(threshold ${params.miss_waste_dollars_per_hour:g}/h).",
               "cache-miss-waste-high"),
        alert_rule(params, "TokenpathCollectorDroppingSpans",
               f"{dropped} > {params.collector_drop_per_second:g}",
               params.collector_for, SEVERITY_WARNING,
               f"Collector {instance} drops spans",
               f"Collector {instance} drops {value} spans/s "
               f"(reason {{{{ $labels.{mn.LABEL_REASON} }}}}).",
               "collector-dropping-or-evicting"),
        alert_rule(params, "TokenpathCollectorEvictingTraces",
               f"{evicted} > {params.collector_evict_per_second:g}",
               params.collector_for, SEVERITY_WARNING,
               f"Collector {instance} evicts in-flight traces",
               f"Collector {instance} evicts {value} traces/s "
               f"(reason {{{{ $labels.{mn.LABEL_REASON} }}}}); records are incomplete.",
               "collector-dropping-or-evicting"),
        alert_rule(params, "TokenpathCollectorStoreErrors",
               f"{q.sum_rate(mn.STORE_ERRORS.series, params.rate_window, by=(mn.LABEL_INSTANCE,))}"
               " > 0",
               params.collector_for, SEVERITY_WARNING,
               f"Collector {instance} fails to write records",
               f"Collector {instance} has {value} store write failures/s.",
               "collector-dropping-or-evicting"),
        alert_rule(params, "TokenpathAgentDown",
               f"{q.selector(mn.UP_SERIES, (q.eq(mn.LABEL_JOB, params.agent_job),))} == 0",
               params.agent_down_for, SEVERITY_CRITICAL,
               f"tokenpath agent {instance} is down",
               f"Prometheus cannot scrape the tokenpath agent at {instance}; GPU and NIC "
               "metrics and cost apportionment for that node are missing.",
               "agent-or-nvml-down"),
        alert_rule(params, "TokenpathNVMLDown",
               f"{mn.AGENT_NVML_UP.series} == 0",
               params.nvml_down_for, SEVERITY_WARNING,
               f"NVML unavailable on {instance}",
               f"The tokenpath agent at {instance} cannot read NVML; GPU metrics are missing.",
               "agent-or-nvml-down"),
    ]
    return alerts


def rule_groups(params: RuleParams) -> dict[str, Any]:
    """The rule file's content: one recording group, one alert group."""
    params.validate()
    return {"groups": [
        {"name": RECORDING_GROUP, "interval": params.evaluation_interval,
         "rules": recording_rules(params)},
        {"name": ALERT_GROUP, "interval": params.evaluation_interval,
         "rules": alert_rules(params)},
    ]}


class _BlockDumper(yaml.SafeDumper):
    """Writes multi-line strings (PromQL) as literal blocks."""


def _str_representer(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_BlockDumper.add_representer(str, _str_representer)


def to_yaml(document: dict[str, Any]) -> str:
    return yaml.dump(document, Dumper=_BlockDumper, sort_keys=False, width=4096,
                     default_flow_style=False)


def rules_yaml(params: RuleParams) -> str:
    header = ("# Generated by `tokenpath dashboards build` from dashboards/rules.py;"
              " do not edit.\n")
    return header + to_yaml(rule_groups(params))
