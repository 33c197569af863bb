"""docs/reference.md: the contract users depend on, generated from the code.

Commands and their options come from the CLI itself (typer's click tree), metric names,
types, labels and help from ``tokenpath.metric_names``, span attributes (with the comment
beside each in the source) from ``tokenpath.attributes``, and the JSON shapes from the
record, report and chargeback classes. ``tokenpath dashboards build`` writes the file and
the regeneration test fails when the committed one differs, so the page is what the code
does.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from typing import Any

from tokenpath import attributes, metric_names, views
from tokenpath.collector.cost.chargeback import ChargebackRow
from tokenpath.collector.cost.prices import load_price_sheet
from tokenpath.collector.cost.whatif import Scenario
from tokenpath.collector.cost.whatif_overview import WhatIfWindow, run_whatif, whatif_overview
from tokenpath.metric_names import (
    AGENT_METRICS,
    BUILD_METRICS,
    COLLECTOR_METRICS,
    MetricSpec,
)
from tokenpath.query import Window
from tokenpath.records import RequestRecord

HEADER = """# Reference

Generated from the code by `tokenpath dashboards build` (dashboards/reference.py); a test
fails when this page and the code differ. Commands and flags, metric names and labels, the
span attributes the collector reads or the shims write, and the JSON shapes of the API and
CLI. Why each exists is in the other docs: [architecture](architecture.md),
[cost model](cost-model.md), [stages](stages.md), [operations](operations.md).
"""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


# --- commands ------------------------------------------------------------------------------


# typer carries its own click: its classes are read by what they have, not their type
def _commands(group: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    for name in sorted(group.commands):
        command = group.commands[name]
        path = f"{prefix} {name}"
        if hasattr(command, "commands"):
            yield from _commands(command, path)
        else:
            yield path, command


def _option_names(param: Any) -> str:
    if getattr(param, "param_type_name", "") == "argument":
        return f"`{(param.name or '').upper()}`"
    names = list(param.opts) + list(getattr(param, "secondary_opts", []))
    return ", ".join(f"`{n}`" for n in names)


def commands_section(root: Any) -> list[str]:
    lines = ["## Commands", ""]
    for path, command in [("tokenpath", root), *_commands(root, "tokenpath")]:
        summary = _cell((command.help or "").split("\n\n")[0])
        lines += [f"### `{path}`", "", summary, ""]
        params = [p for p in command.params if p.name != "help"]
        if params:
            lines += ["| option | help |", "|---|---|"]
            for param in params:
                help_text = _cell(getattr(param, "help", None) or "")
                lines.append(f"| {_option_names(param)} | {help_text} |")
            lines.append("")
    return lines


# --- metrics -------------------------------------------------------------------------------


def _all_specs() -> list[MetricSpec]:
    return [v for v in vars(metric_names).values() if isinstance(v, MetricSpec)]


def _metric_table(title: str, specs: list[MetricSpec]) -> list[str]:
    lines = [f"### {title}", "", "| series | type | labels | help |", "|---|---|---|---|"]
    for spec in specs:
        labels = ", ".join(f"`{label}`" for label in spec.labels) or "-"
        lines.append(f"| `{spec.series}` | {spec.type} | {labels} | {_cell(spec.help)} |")
    return [*lines, ""]


def metrics_section() -> list[str]:
    specs = _all_specs()
    self_telemetry = [s for s in specs if s.name.startswith(f"{metric_names.NAMESPACE}_collector_")]
    listed = {s.name for s in (*COLLECTOR_METRICS, *AGENT_METRICS, *BUILD_METRICS,
                               *self_telemetry)}
    rest = [s for s in specs if s.name not in listed]
    renamed = sorted(metric_names.RENAMED_FROM.items())
    lines = ["## Metrics", "",
             "Counters are exposed with `_total`; histograms as `_bucket`, `_sum`, `_count`.",
             ""]
    lines += _metric_table("Collector: requests, cost, energy", list(COLLECTOR_METRICS))
    lines += _metric_table("Collector: self-telemetry", self_telemetry)
    lines += _metric_table("Node agent", list(AGENT_METRICS))
    lines += _metric_table("Build (collector and agent)", list(BUILD_METRICS))
    if rest:
        lines += _metric_table("Other", rest)
    if renamed:
        lines += ["Renamed metrics, still written under the old name too:", ""]
        lines += [f"- `{metric_names.NAMESPACE}_{old}` is now `{metric_names.NAMESPACE}_{new}`"
                  for new, old in renamed]
        lines.append("")
    return lines


# --- span attributes -----------------------------------------------------------------------


def _attribute_rows() -> Iterator[tuple[str, str, str, str]]:
    """(section, constant, value, comment) for each string constant in attributes.py: the
    section is the nearest ``# --- name ---`` header above it, the comment the comment
    lines right above it and the one beside it."""
    source = inspect.getsource(attributes)
    lines = source.splitlines()
    sections: list[str] = []
    section = "General"
    for line in lines:
        text = line.strip()
        if text.startswith("# ---"):
            section = text.lstrip("#").strip().strip("-").strip()
        sections.append(section)
    for node in ast.parse(source).body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) else None)
        value = getattr(node, "value", None)
        if not isinstance(target, ast.Name) or not isinstance(value, ast.Constant) or (
                not isinstance(value.value, str)):
            continue
        comments: list[str] = []
        index = node.lineno - 2
        while index >= 0 and lines[index].lstrip().startswith("#") and not (
                lines[index].lstrip().startswith("# ---")):
            comments.insert(0, lines[index].strip().lstrip("#").strip())
            index -= 1
        after = lines[node.lineno - 1].split("=", 1)[-1]
        inline = after.split("#", 1)[1].strip() if "#" in after else ""
        yield (sections[node.lineno - 1], target.id, value.value,
               " ".join([*comments, inline]).strip())


def attributes_section() -> list[str]:
    lines = ["## Span attributes, events and span names", "",
             "Names the collector reads and the shims and engine hooks write "
             "(tokenpath/attributes.py).", ""]
    current = None
    for section, constant, value, comment in _attribute_rows():
        if section != current:
            lines += ["", f"### {section}", "", "| name | constant | note |", "|---|---|---|"]
            current = section
        lines.append(f"| `{value}` | `{constant}` | {_cell(comment)} |")
    return [*lines, ""]


# --- JSON shapes ---------------------------------------------------------------------------


def _keys(data: dict[str, Any]) -> str:
    return ", ".join(f"`{key}`" for key in data)


def json_section() -> list[str]:
    record = RequestRecord(trace_id="0" * 32)
    with views.over_records([record]) as queries:
        report = views.report_view(queries, Window()).to_json()
    report.pop("window")  # a store's: listed below
    return [
        "## JSON shapes", "",
        "A request record (`tokenpath requests --format json`, `/api/requests`, the store):",
        "", _keys(record.to_json()), "",
        "A report (`tokenpath report --format json`, `/api/report`):", "", _keys(report), "",
        "From a store also `window`: `since_unix`, `until_unix`, `retention_seconds`, "
        "`oldest_record_end_unix`, `note` (when the window reaches back past the retention), "
        "`quantile_relative_error` (tokenpath/views.py).", "",
        "A chargeback row (`tokenpath chargeback --format json`, `/api/chargeback`):", "",
        _keys(ChargebackRow("tenant").to_json()), "",
        *whatif_shapes(),
    ]


def whatif_shapes() -> list[str]:
    """The what-if JSON, from one made-up request run through the code that answers it."""
    record = RequestRecord(trace_id="0" * 32, input_tokens=32, output_tokens=2)
    prices = load_price_sheet()
    projection = run_whatif([record], prices, Scenario())
    page = whatif_overview([record], prices, WhatIfWindow(None, None, 0.0))
    return [
        "A what-if projection (`tokenpath whatif --format json`, `POST /api/whatif`; "
        "`change` is relative, 0.1 = 10 % more; `change_pp` in percentage points; "
        "`cache_hit_rate` says a hit-ratio change asked, possible and applied; with "
        "`--router prefix-affine` also `routing`; the CLI adds `window`):", "",
        _keys(projection), "",
        "The what-if page (`GET /api/whatif?since=D&until=T`, `since` counted back from "
        "`until`, as `tokenpath whatif --since D --until T`):", "", _keys(page), "",
        "One of its `scenarios` (the projection of its `cli_flags`; `prefix_affine`'s also "
        "carries `routing`):", "", _keys(page["scenarios"][1]), "",
    ]


def reference_markdown(cli: Any) -> str:
    """The reference page, its commands read off the CLI's root command ``cli``."""
    parts = [HEADER, *commands_section(cli), *metrics_section(), *attributes_section(),
             *json_section()]
    text = "\n".join(parts)
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text.rstrip("\n") + "\n"
