"""The five tokenpath dashboards: Overview, Stages, Cache and leaks, Nodes, Chargeback.

Queries come from ``tokenpath.dashboards.queries`` (metric names from
``tokenpath.metric_names``), stage panels from ``tokenpath.stages.STAGES``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.models import dashboard as dashboard_models

from tokenpath import metric_names as mn
from tokenpath.dashboards import panels as p
from tokenpath.dashboards import queries as q
from tokenpath.dashboards.budgets import BUDGET_SERIES
from tokenpath.stages import STAGES, Phase, Provenance, Stage, StageGroup, StageId

W = q.RATE_INTERVAL
MODEL = (q.MODEL_MATCHER,)
POOL = (q.POOL_MATCHER,)
TTFT_QUANTILES = (0.5, 0.95, 0.99)
TPOT_QUANTILES = (0.5, 0.95)
STAGE_QUANTILES = (0.5, 0.95)

# The "compare with" variable of the cache dashboard: how far back the baseline sits.
VAR_BASELINE = "baseline"
BASELINE_CHOICES = ("1d", "1h", "7d")

# How each stage's figure is obtained, by where it sits on the path (docs/cost-model.md):
# GPU stages split the measured in-model time by the roofline model, network stages are
# bytes over link rates, the rest are timed by spans.
PROVENANCE_BY_GROUP: dict[StageGroup, Provenance] = {
    StageGroup.CLIENT: Provenance.MEASURED,
    StageGroup.GATEWAY: Provenance.MEASURED,
    StageGroup.ENGINE: Provenance.MEASURED,
    StageGroup.GPU: Provenance.MODELED,
    StageGroup.NETWORK: Provenance.DERIVED,
}
# Stages timed otherwise than their group: the engine hook measures GPU dispatch (the
# host-side step overhead); the rest of the GPU group splits in-model time by the model.
PROVENANCE_BY_STAGE: dict[StageId, Provenance] = {StageId.GPU_DISPATCH: Provenance.MEASURED}


@dataclass(frozen=True, slots=True)
class DashboardDefinition:
    """A dashboard's file stem, stable uid and builder."""

    file_stem: str
    uid: str
    build: Callable[[], dashboard_builders.Dashboard]


def _legend(*labels: str) -> str:
    return " ".join(f"{{{{{label}}}}}" for label in labels)


def _quantile_queries(spec: mn.MetricSpec, quantiles: tuple[float, ...],
                      matchers: tuple[str, ...], by: tuple[str, ...] = ()) -> list[p.Query]:
    return [p.Query(q.histogram_quantile(quantile, spec, W, matchers, by),
                    f"p{round(quantile * 100)} {_legend(*by)}".strip())
            for quantile in quantiles]


def overview() -> dashboard_builders.Dashboard:
    hit_ratio = q.prefix_cache_hit_ratio(W, MODEL)
    per_million = q.dollars_per_million_output_tokens(W, MODEL)
    output_rate = q.token_rate(mn.TOKEN_KIND_OUTPUT, W, MODEL)
    by_model = (mn.LABEL_MODEL,)
    by_slo = (mn.LABEL_SLO,)
    return (
        p.base_dashboard("tokenpath-overview", "tokenpath / Overview",
                         "Cache hits, latency, throughput and dollars per token.")
        .with_row(dashboard_builders.Row("Now"))
        .with_panel(p.stat_panel("Prefix-cache hit ratio",
                                 "Token-weighted: cache_read tokens / input tokens.",
                                 [p.Query(hit_ratio, "hit ratio")], p.UNIT_PERCENT_UNIT))
        .with_panel(p.stat_panel("TTFT p95", "95th percentile time to first token.",
                                 _quantile_queries(mn.TTFT, (0.95,), MODEL), p.UNIT_SECONDS))
        .with_panel(p.stat_panel("$ per million output tokens",
                                 "Attributed dollars (all stages) per million output tokens.",
                                 [p.Query(per_million, "$/M output tokens")], p.UNIT_DOLLARS))
        .with_panel(p.stat_panel("Output tokens/s", "Output tokens per second.",
                                 [p.Query(output_rate, "tokens/s")], p.UNIT_PER_SECOND))
        .with_row(dashboard_builders.Row("Trends"))
        .with_panel(p.timeseries_panel(
            "Prefix-cache hit ratio by model", "Token-weighted hit ratio per model.",
            [p.Query(q.prefix_cache_hit_ratio(W, MODEL, by_model), _legend(mn.LABEL_MODEL))],
            p.UNIT_PERCENT_UNIT))
        .with_panel(p.timeseries_panel(
            "Time to first token", "TTFT p50, p95 and p99 over all selected models.",
            _quantile_queries(mn.TTFT, TTFT_QUANTILES, MODEL), p.UNIT_SECONDS))
        .with_panel(p.timeseries_panel(
            "Time per output token", "Mean seconds per output token after the first.",
            _quantile_queries(mn.TPOT, TPOT_QUANTILES, MODEL), p.UNIT_SECONDS))
        .with_panel(p.timeseries_panel(
            "Output tokens/s by model", "Output tokens per second.",
            [p.Query(q.token_rate(mn.TOKEN_KIND_OUTPUT, W, MODEL, by_model),
                     _legend(mn.LABEL_MODEL))], p.UNIT_PER_SECOND))
        .with_panel(p.timeseries_panel(
            "Requests/s by status", "Requests recorded by the collector.",
            [p.Query(q.sum_rate(mn.REQUESTS.series, W, MODEL, (mn.LABEL_STATUS,)),
                     _legend(mn.LABEL_STATUS))], p.UNIT_REQUESTS_PER_SECOND))
        .with_panel(p.timeseries_panel(
            "$ per million output tokens by model", "Attributed dollars per million output "
            "tokens, per model.",
            [p.Query(q.dollars_per_million_output_tokens(W, MODEL, by_model),
                     _legend(mn.LABEL_MODEL))], p.UNIT_DOLLARS))
        .with_panel(p.timeseries_panel(
            "$ per hour by stage", "Attributed dollars per hour, stacked by stage.",
            [p.Query(q.dollars_per_hour(mn.COST, W, MODEL, (mn.LABEL_STAGE,)),
                     _legend(mn.LABEL_STAGE))], p.UNIT_DOLLARS, stacked=True))
        .with_panel(p.timeseries_panel(
            "Idle cost per hour by pool", "Dollars per hour of GPU time with no request "
            "active.",
            [p.Query(q.dollars_per_hour(mn.IDLE_COST, W, POOL, (mn.LABEL_POOL,)),
                     _legend(mn.LABEL_POOL))], p.UNIT_DOLLARS, stacked=True))
        .with_panel(p.timeseries_panel(
            "GPU energy per output token", "Joules of GPU energy attributed per output "
            "token, by model: the node agents' measured GPU joules apportioned like dollars, "
            "modeled (GPU-seconds x TDP) where no agent reports them "
            "(collector/cost/energy.py). The measured share is "
            f"{mn.ENERGY_MEASURED.series} / {mn.ENERGY.series}.",
            [p.Query(f"{q.sum_rate(mn.ENERGY.series, W, MODEL, by_model)}\n/ on("
                     f"{mn.LABEL_MODEL})\n{q.token_rate(mn.TOKEN_KIND_OUTPUT, W, MODEL, by_model)}",
                     _legend(mn.LABEL_MODEL))],
            p.UNIT_PER_SECOND, width=p.FULL_WIDTH))
        .with_row(dashboard_builders.Row("SLO: goodput and dollars per good request"))
        .with_panel(p.timeseries_panel(
            "Goodput by SLO class", "Requests per second that met their SLO class's targets "
            "(the collector's slo_classes).",
            [p.Query(q.slo_goodput(W, MODEL, by_slo), _legend(mn.LABEL_SLO))],
            p.UNIT_REQUESTS_PER_SECOND))
        .with_panel(p.timeseries_panel(
            "$ per good request by SLO class", "Every attributed dollar of a class's requests "
            "(met, missed, unknown) over its requests that met their targets.",
            [p.Query(q.slo_dollars_per_good_request(W, MODEL, by_slo),
                     _legend(mn.LABEL_SLO))], p.UNIT_DOLLARS))
        .with_panel(p.timeseries_panel(
            "SLO attainment by class", "Met / (met + missed) requests; requests whose outcome "
            "is unknown count neither way. The burn-rate alerts hold it against each class's "
            "objective.",
            [p.Query(q.slo_attainment(W, MODEL, by_slo), _legend(mn.LABEL_SLO))],
            p.UNIT_PERCENT_UNIT))
        .with_panel(p.timeseries_panel(
            "$ per hour by SLO class and outcome", "Attributed dollars per hour of the "
            "requests that met, missed (overlapping the money leaks: never add them) or "
            "could not be judged against their class's targets.",
            [p.Query(q.dollars_per_hour(mn.SLO_DOLLARS, W, MODEL,
                                        (mn.LABEL_SLO, mn.LABEL_OUTCOME)),
                     _legend(mn.LABEL_SLO, mn.LABEL_OUTCOME))], p.UNIT_DOLLARS, stacked=True))
    )


def _stage_provenance(stage: Stage) -> Provenance:
    return PROVENANCE_BY_STAGE.get(stage.id, PROVENANCE_BY_GROUP[stage.group])


def _stage_table_markdown() -> str:
    lines = ["| # | stage | bound by | emitted by | provenance |", "|---|---|---|---|---|"]
    lines += [f"| {stage.order} | {stage.title} (`{stage.id.value}`) | {stage.bound_by} | "
              f"{stage.emitted_by} | {_stage_provenance(stage).value} |" for stage in STAGES]
    lines.append("")
    lines.append(f"*{Provenance.MODELED.value}*: a roofline split of the measured in-model "
                 f"time, never added time; *{Provenance.DERIVED.value}*: arithmetic on measured"
                 " values (bytes / link rate).")
    return "\n".join(lines)


def stages() -> dashboard_builders.Dashboard:
    by_stage = (mn.LABEL_STAGE,)
    board = (
        p.base_dashboard("tokenpath-stages", "tokenpath / Stages",
                         "Latency and dollars of each of the 15 stages, prefill vs decode.")
        .with_row(dashboard_builders.Row("All stages"))
        .with_panel(p.timeseries_panel(
            "Stage latency p95", "95th percentile seconds per request, by stage.",
            _quantile_queries(mn.STAGE_DURATION, (0.95,), MODEL, by_stage), p.UNIT_SECONDS))
        .with_panel(p.timeseries_panel(
            "$ per hour by stage", "Attributed dollars per hour, stacked by stage.",
            [p.Query(q.dollars_per_hour(mn.COST, W, MODEL, by_stage),
                     _legend(mn.LABEL_STAGE))], p.UNIT_DOLLARS, stacked=True))
        .with_panel(p.timeseries_panel(
            "Prefill vs decode $ per hour", f"Dollars per hour by phase "
            f"({Phase.PREFILL.value} is compute-bound, {Phase.DECODE.value} is "
            "memory-bandwidth-bound).",
            [p.Query(q.dollars_per_hour(mn.COST, W, MODEL, (mn.LABEL_PHASE,)),
                     _legend(mn.LABEL_PHASE))], p.UNIT_DOLLARS, stacked=True))
        .with_panel(p.timeseries_panel(
            "Prefill vs decode $ by stage", "Dollars per hour by stage and phase.",
            [p.Query(q.dollars_per_hour(mn.COST, W, MODEL, (mn.LABEL_STAGE, mn.LABEL_PHASE)),
                     _legend(mn.LABEL_STAGE, mn.LABEL_PHASE))], p.UNIT_DOLLARS, stacked=True))
        .with_panel(p.text_panel("Stages and provenance", _stage_table_markdown(),
                                 height=2 * p.PANEL_HEIGHT))
    )
    for stage in STAGES:
        matchers = (*MODEL, q.eq(mn.LABEL_STAGE, stage.id.value))
        provenance = _stage_provenance(stage).value
        board = (
            board.with_row(dashboard_builders.Row(f"{stage.order}. {stage.title}"))
            .with_panel(p.timeseries_panel(
                f"{stage.title}: latency ({provenance})",
                f"Seconds per request in {stage.id.value}; bound by {stage.bound_by}.",
                _quantile_queries(mn.STAGE_DURATION, STAGE_QUANTILES, matchers),
                p.UNIT_SECONDS))
            .with_panel(p.timeseries_panel(
                f"{stage.title}: $ per hour by phase ({provenance})",
                f"Attributed dollars per hour in {stage.id.value}, by phase.",
                [p.Query(q.dollars_per_hour(mn.COST, W, matchers, (mn.LABEL_PHASE,)),
                         _legend(mn.LABEL_PHASE))], p.UNIT_DOLLARS, stacked=True))
        )
    return board


def _baseline_variable() -> dashboard_builders.CustomVariable:
    first = BASELINE_CHOICES[0]
    return (dashboard_builders.CustomVariable(VAR_BASELINE).label("Compare with")
            .values(",".join(BASELINE_CHOICES))
            .current(dashboard_models.VariableOption(selected=True, text=first, value=first)))


def cache_and_leaks() -> dashboard_builders.Dashboard:
    by_model = (mn.LABEL_MODEL,)
    baseline = f"${VAR_BASELINE}"
    small = q.eq(mn.LABEL_SIZE, mn.CHUNK_SIZE_SMALL)
    return (
        p.base_dashboard("tokenpath-cache-leaks", "tokenpath / Cache and leaks",
                         "Where money leaks: cache misses, long contexts, small packets.")
        .with_variable(_baseline_variable())
        .with_panel(p.timeseries_panel(
            "Prefix-cache hit ratio: now vs baseline",
            "Token-weighted hit ratio now and `$baseline` ago (default one day).",
            [p.Query(q.prefix_cache_hit_ratio(W, MODEL), "now"),
             p.Query(q.prefix_cache_hit_ratio(W, MODEL, shift=baseline), f"{baseline} ago")],
            p.UNIT_PERCENT_UNIT, width=p.FULL_WIDTH))
        .with_panel(p.stat_panel(
            "Miss waste in range", "Prefill dollars spent recomputing prefixes seen recently.",
            [p.Query(q.sum_increase(mn.CACHE_MISS_WASTE.series, "$__range", MODEL),
                     "miss waste")], p.UNIT_DOLLARS, width=p.THIRD_WIDTH))
        .with_panel(p.timeseries_panel(
            "Miss waste $ per hour by model", "Cache-miss waste, dollars per hour.",
            [p.Query(q.dollars_per_hour(mn.CACHE_MISS_WASTE, W, MODEL, by_model),
                     _legend(mn.LABEL_MODEL))], p.UNIT_DOLLARS, width=2 * p.THIRD_WIDTH))
        .with_panel(p.timeseries_panel(
            "Prefix-cache misses $ per hour by cause",
            "Prefill dollars of prefix blocks computed instead of read from the cache: cold "
            "(first use, not waste), routed_elsewhere (fix: a prefix-affine router), evicted "
            "(fix: more KV memory or a host tier), sub_block (block granularity).",
            [p.Query(q.dollars_per_hour(mn.CACHE_MISS_DOLLARS, W, MODEL, (mn.LABEL_CAUSE,)),
                     _legend(mn.LABEL_CAUSE))], p.UNIT_DOLLARS, width=p.FULL_WIDTH,
            stacked=True))
        .with_panel(p.timeseries_panel(
            "Recomputed prompt tokens/s by cause: measured by the engines vs inferred",
            "Measured: full KV blocks the engines reported stored without holding them, from "
            "their KV-cache events (node agent, docs/agent.md): evicted, routed (another "
            "engine of the model on the node held it), cold. Inferred: tokenpath's prefix "
            "fingerprints over the whole fleet (cold, routed_elsewhere, evicted, sub_block). "
            "Where the two disagree, the measured side is the engines' own account; "
            "routed is per node there, fleet-wide here.",
            [p.Query(q.sum_rate(mn.KV_RECOMPUTED_TOKENS.series, W, MODEL, (mn.LABEL_CAUSE,)),
                     f"measured {_legend(mn.LABEL_CAUSE)}"),
             p.Query(q.sum_rate(mn.CACHE_MISS_TOKENS.series, W, MODEL, (mn.LABEL_CAUSE,)),
                     f"inferred {_legend(mn.LABEL_CAUSE)}")],
            p.UNIT_PER_SECOND, width=p.FULL_WIDTH))
        .with_panel(p.timeseries_panel(
            "Cost share by context length", "Share of dollars per context-length bucket.",
            [p.Query(q.share_of_total(mn.LONG_CONTEXT_COST, mn.LABEL_CONTEXT_BUCKET, W, MODEL),
                     _legend(mn.LABEL_CONTEXT_BUCKET))], p.UNIT_PERCENT_UNIT, stacked=True))
        .with_panel(p.timeseries_panel(
            "Small-packet share", "Share of streamed response chunks under 64 bytes.",
            [p.Query(q.share_matching(mn.RESPONSE_CHUNKS, small, W, MODEL, by_model),
                     _legend(mn.LABEL_MODEL))], p.UNIT_PERCENT_UNIT))
        .with_panel(p.timeseries_panel(
            "Attributed vs wall-clock $ per hour", "tokenpath's attributed dollars next to "
            "duration x GPU price, as gateway tools count it.",
            [p.Query(q.dollars_per_hour(mn.COST, W, MODEL), "attributed"),
             p.Query(q.dollars_per_hour(mn.NAIVE_COST, W, MODEL), "wall-clock")],
            p.UNIT_DOLLARS, width=p.FULL_WIDTH))
    )


def nodes() -> dashboard_builders.Dashboard:
    gpu = (mn.LABEL_INSTANCE, mn.LABEL_GPU)
    nic = (mn.LABEL_INSTANCE, mn.LABEL_DEVICE)
    used = q.selector(mn.GPU_MEMORY_USED.series, POOL)
    total = q.selector(mn.GPU_MEMORY_TOTAL.series, POOL)
    return (
        p.base_dashboard("tokenpath-nodes", "tokenpath / Nodes",
                         "GPU, HBM, power and NIC from the tokenpath agent.")
        .with_panel(p.timeseries_panel(
            "GPU utilization", "Share of time a kernel was running.",
            [p.Query(q.selector(mn.GPU_UTILIZATION.series, POOL), _legend(*gpu))],
            p.UNIT_PERCENT_UNIT))
        .with_panel(p.timeseries_panel(
            "HBM used", "HBM bytes used.",
            [p.Query(used, _legend(*gpu))], p.UNIT_BYTES))
        .with_panel(p.timeseries_panel(
            "HBM used share", "HBM used / total.",
            [p.Query(f"{used}\n/\n{total}", _legend(*gpu))], p.UNIT_PERCENT_UNIT))
        .with_panel(p.timeseries_panel(
            "HBM bandwidth utilization", "Share of time HBM was read or written.",
            [p.Query(q.selector(mn.GPU_MEMORY_BW_UTIL.series, POOL), _legend(*gpu))],
            p.UNIT_PERCENT_UNIT))
        .with_panel(p.timeseries_panel(
            "GPU power", "Board power draw.",
            [p.Query(q.selector(mn.GPU_POWER.series, POOL), _legend(*gpu))], p.UNIT_WATTS))
        .with_panel(p.timeseries_panel(
            "NIC throughput", "Bytes per second transmitted and received, per NIC.",
            [p.Query(q.sum_rate(mn.NODE_NET_TX_BYTES.series, W, POOL, nic),
                     f"tx {_legend(*nic)}"),
             p.Query(q.sum_rate(mn.NODE_NET_RX_BYTES.series, W, POOL, nic),
                     f"rx {_legend(*nic)}")], p.UNIT_BYTES_PER_SECOND))
        .with_panel(p.timeseries_panel(
            "KV transfer of disaggregated requests, by link",
            "KV cache bytes per second that requests served by a prefill engine and a decode "
            "engine moved between them (modeled: transferred tokens x the model's KV bytes "
            "per token), by link: nvlink inside a node, network across nodes.",
            [p.Query(q.sum_rate(mn.KV_TRANSFER_BYTES.series, W, (), (mn.LABEL_LINK,)),
                     _legend(mn.LABEL_LINK))], p.UNIT_BYTES_PER_SECOND, width=p.FULL_WIDTH))
    )


def chargeback_board() -> dashboard_builders.Dashboard:
    by_tenant = (mn.LABEL_TENANT,)
    burn = (f"{q.sum_rate(mn.TENANT_COST.series, W, MODEL, by_tenant)}\n"
            f"/ on({mn.LABEL_TENANT}) {BUDGET_SERIES}")
    return (
        p.base_dashboard("tokenpath-chargeback", "tokenpath / Chargeback",
                         "Attributed dollars by tenant, and their budgets' burn rates. "
                         "Idle dollars are per pool (Overview); `tokenpath chargeback` "
                         "allocates them.")
        .with_panel(p.stat_panel(
            "Attributed $ in range", "Attributed dollars of every tenant in the range.",
            [p.Query(q.sum_increase(mn.TENANT_COST.series, "$__range", MODEL), "attributed")],
            p.UNIT_DOLLARS, width=p.THIRD_WIDTH))
        .with_panel(p.timeseries_panel(
            "Attributed $ per hour by tenant", "Each tenant's attributed dollars per hour.",
            [p.Query(q.dollars_per_hour(mn.TENANT_COST, W, MODEL, by_tenant),
                     _legend(mn.LABEL_TENANT))], p.UNIT_DOLLARS, width=2 * p.THIRD_WIDTH,
            stacked=True))
        .with_panel(p.timeseries_panel(
            "Share of spend by tenant", "Each tenant's share of the attributed dollars.",
            [p.Query(q.share_of_total(mn.TENANT_COST, mn.LABEL_TENANT, W, MODEL),
                     _legend(mn.LABEL_TENANT))], p.UNIT_PERCENT_UNIT, stacked=True))
        .with_panel(p.timeseries_panel(
            "Requests per second by tenant", "Requests recorded per tenant.",
            [p.Query(q.sum_rate(mn.TENANT_REQUESTS.series, W, MODEL, by_tenant),
                     _legend(mn.LABEL_TENANT))], p.UNIT_REQUESTS_PER_SECOND))
        .with_panel(p.timeseries_panel(
            "Budget burn rate by tenant", "Spend rate over the budget rate (1 = on budget; "
            "the alerts page at 14.4 over 1 h and 6 over 6 h). Needs the budget rules "
            "(`tokenpath dashboards budget-rules`).",
            [p.Query(burn, _legend(mn.LABEL_TENANT))], p.UNIT_PER_SECOND, width=p.FULL_WIDTH))
    )


DASHBOARDS: tuple[DashboardDefinition, ...] = (
    DashboardDefinition("overview", "tokenpath-overview", overview),
    DashboardDefinition("stages", "tokenpath-stages", stages),
    DashboardDefinition("cache-and-leaks", "tokenpath-cache-leaks", cache_and_leaks),
    DashboardDefinition("nodes", "tokenpath-nodes", nodes),
    DashboardDefinition("chargeback", "tokenpath-chargeback", chargeback_board),
)
