"""Thin helpers over grafana-foundation-sdk: one way to make each kind of panel.

Every panel reads from the ``$datasource`` template variable; every dashboard has the
datasource, model and pool variables (``tokenpath.dashboards.queries`` names them).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.builders import prometheus, stat, text, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_models
from grafana_foundation_sdk.models import dashboard as dashboard_models
from grafana_foundation_sdk.models.text import TextMode

from tokenpath import metric_names as mn
from tokenpath.dashboards import queries as q

PROMETHEUS_PLUGIN = "prometheus"
DATASOURCE_REF = dashboard_models.DataSourceRef(type_val=PROMETHEUS_PLUGIN,
                                                uid=f"${{{q.VAR_DATASOURCE}}}")
DASHBOARD_TAG = "tokenpath"
DEFAULT_TIME_FROM = "now-6h"
DEFAULT_REFRESH = "30s"
PANEL_HEIGHT = 8
HALF_WIDTH = 12
THIRD_WIDTH = 8
QUARTER_WIDTH = 6
FULL_WIDTH = 24
ALL_VALUE = ".*"
STACKED_FILL_OPACITY = 60.0

# Grafana unit ids.
UNIT_PERCENT_UNIT = "percentunit"
UNIT_SECONDS = "s"
UNIT_DOLLARS = "currencyUSD"
UNIT_REQUESTS_PER_SECOND = "reqps"
UNIT_PER_SECOND = "short"
UNIT_BYTES = "bytes"
UNIT_BYTES_PER_SECOND = "Bps"
UNIT_WATTS = "watt"


@dataclass(frozen=True, slots=True)
class Query:
    """One PromQL target and the legend Grafana shows for its series."""

    expr: str
    legend: str


def _target(query: Query, ref_id: str) -> prometheus.Dataquery:
    return (prometheus.Dataquery().expr(query.expr).legend_format(query.legend)
            .ref_id(ref_id).datasource(DATASOURCE_REF).range())


def _ref_id(index: int) -> str:
    return chr(ord("A") + index)


def timeseries_panel(title: str, description: str, queries: Sequence[Query], unit: str,
                     *, stacked: bool = False, width: int = HALF_WIDTH) -> timeseries.Panel:
    panel = (timeseries.Panel().title(title).description(description).unit(unit)
             .datasource(DATASOURCE_REF).height(PANEL_HEIGHT).span(width)
             .legend(common_builders.VizLegendOptions()
                     .display_mode(common_models.LegendDisplayMode.LIST)
                     .placement(common_models.LegendPlacement.BOTTOM).show_legend(True))
             .tooltip(common_builders.VizTooltipOptions()
                      .mode(common_models.TooltipDisplayMode.MULTI)
                      .sort(common_models.SortOrder.DESCENDING)))
    for index, query in enumerate(queries):
        panel = panel.with_target(_target(query, _ref_id(index)))
    if stacked:
        panel = (panel.stacking(common_builders.StackingConfig()
                                .mode(common_models.StackingMode.NORMAL))
                 .fill_opacity(STACKED_FILL_OPACITY))
    return panel


def stat_panel(title: str, description: str, queries: Sequence[Query], unit: str,
               *, width: int = QUARTER_WIDTH) -> stat.Panel:
    panel = (stat.Panel().title(title).description(description).unit(unit)
             .datasource(DATASOURCE_REF).height(PANEL_HEIGHT).span(width)
             .graph_mode(common_models.BigValueGraphMode.AREA))
    for index, query in enumerate(queries):
        panel = panel.with_target(_target(query, _ref_id(index)))
    return panel


def text_panel(title: str, markdown: str, *, width: int = FULL_WIDTH,
               height: int = PANEL_HEIGHT) -> text.Panel:
    return (text.Panel().title(title).mode(TextMode.MARKDOWN).content(markdown)
            .height(height).span(width))


def _query_variable(name: str, label: str,
                    metric: mn.MetricSpec) -> dashboard_builders.QueryVariable:
    return (dashboard_builders.QueryVariable(name).label(label)
            .query(f"label_values({metric.series}, {name})")
            .datasource(DATASOURCE_REF)
            .refresh(dashboard_models.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dashboard_models.VariableSort.ALPHABETICAL_ASC)
            .multi(True).include_all(True).all_value(ALL_VALUE))


def base_dashboard(uid: str, title: str, description: str) -> dashboard_builders.Dashboard:
    """A dashboard with the shared variables, tags, time range and refresh."""
    return (dashboard_builders.Dashboard(title).uid(uid).description(description)
            .tags([DASHBOARD_TAG]).time(DEFAULT_TIME_FROM, "now").refresh(DEFAULT_REFRESH)
            .timezone("browser").editable()
            .with_variable(dashboard_builders.DatasourceVariable(q.VAR_DATASOURCE)
                           .label("Data source").type(PROMETHEUS_PLUGIN))
            .with_variable(_query_variable(q.VAR_MODEL, "Model", mn.REQUESTS))
            .with_variable(_query_variable(q.VAR_POOL, "Pool", mn.IDLE_COST)))


def to_json(dashboard: dashboard_builders.Dashboard) -> str:
    """The dashboard as stable, sorted JSON text ending in a newline."""
    return json.dumps(dashboard.build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"
