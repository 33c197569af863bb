"""Rich tables for the report and the request list."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tokenpath.collector.cost.chargeback import ChargebackRow, IdlePolicy
from tokenpath.collector.cost.leak_ranking import RankedLeak
from tokenpath.leaks import LONG_CONTEXT_TOKENS
from tokenpath.records import RequestRecord
from tokenpath.report import Report, combined_energy_provenance
from tokenpath.slo import OUTCOME_MISSED, SloSummary
from tokenpath.stages import STAGE_BY_ID, Phase, Provenance


def _sec(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 0.001:
        return f"{value * 1e6:.0f} µs"
    if value < 1:
        return f"{value * 1e3:.1f} ms"
    return f"{value:.2f} s"


def _usd(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "$0"
    if abs(value) < 0.01:  # three significant digits: a tiny cost is never "$0.000000"
        return f"${value:.3g}"
    return f"${value:,.4f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


ENGINE_PHASES = (Phase.PREFILL, Phase.DECODE)


def render_report(report: Report, console: Console) -> None:
    label = " (simulated engine)" if report.simulated else ""
    table = Table(title=f"tokenpath: {report.requests} requests over "
                        f"{report.window_seconds:.1f} s{label}", title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("stage")
    table.add_column("p50", justify="right")
    table.add_column("p95", justify="right")
    table.add_column("share", justify="right")
    table.add_column("prefill / decode", justify="right")
    table.add_column("cost", justify="right")
    table.add_column("provenance")
    for summary in report.stages:
        stage = STAGE_BY_ID[summary.stage]
        phases = ""
        if summary.phase_seconds:
            phases = " / ".join(_sec(summary.phase_seconds.get(p)) for p in ENGINE_PHASES)
            kv = summary.phase_seconds.get(Phase.KV_TRANSFER)
            if kv:
                phases += f" (+{_sec(kv)} KV transfer)"
        table.add_row(str(stage.order), stage.id.value, _sec(summary.p50_seconds),
                      _sec(summary.p95_seconds), _pct(summary.share_of_latency), phases,
                      _usd(summary.cost_dollars),
                      summary.provenance.value if summary.provenance else "not seen")
    console.print(table)
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()
    facts.add_row("TTFT p50 / p95", f"{_sec(report.ttft_p50_seconds)} / "
                                    f"{_sec(report.ttft_p95_seconds)}")
    facts.add_row("output tokens/s", f"{report.output_tokens_per_second:,.1f}")
    facts.add_row("prefix-cache hit ratio (token-weighted)", _pct(report.prefix_cache_hit_ratio))
    facts.add_row("prefill vs decode in-model time",
                  f"{_sec(report.prefill_seconds)} vs {_sec(report.decode_seconds)}")
    facts.add_row("attributed cost", _usd(report.cost_dollars))
    facts.add_row("idle GPU cost", _usd(report.idle_cost_dollars))
    facts.add_row("naive wall-clock cost", _usd(report.naive_cost_dollars))
    facts.add_row("$ per million output tokens", _usd(report.cost_per_million_output_tokens))
    if report.energy_provenance is not None:
        per_token = (f", {report.energy_joules / report.output_tokens:.2f} J per output token"
                     if report.output_tokens else "")
        facts.add_row(f"GPU energy ({report.energy_provenance})",
                      f"{report.energy_joules / 3.6e6:.4f} kWh{per_token}; idle "
                      f"{report.idle_energy_joules / 3.6e6:.4f} kWh")
    facts.add_row("leak 1: cache-miss waste", _usd(report.cache_miss_waste_dollars))
    for cause, miss in report.miss_by_cause.items():
        if miss.tokens:
            label = "first prefill" if not miss.waste else "waste"
            facts.add_row(f"  miss cause {cause} ({label})",
                          Text(f"{_usd(miss.dollars)}, {miss.tokens:,} tokens; "
                               f"fix: {miss.fix}"))
    facts.add_row(f"leak 2: long contexts (>= {LONG_CONTEXT_TOKENS:,} context tokens)",
                  f"{report.long_context_requests} requests, "
                  f"{_usd(report.long_context_cost_dollars)} "
                  f"({_pct(report.long_context_share_of_cost)} of cost; attention is O(n^2))")
    if report.streams:
        facts.add_row("leak 3: packets per output token (streams)",
                      Text(f"{report.packets_per_output_token or 0:.2f} packets/token, "
                           f"{report.wire_bytes_per_payload_byte or 0:.2f} wire bytes per "
                           f"payload byte; {report.leaking_streams} of {report.streams} "
                           "streams write a packet per 1-2 tokens"))
    else:
        facts.add_row("leak 3: packets per output token (streams)", "no streamed responses")
    if report.slo is not None:
        total = report.slo.total()
        facts.add_row("missed-SLO dollars (overlaps the leaks; not added to them)",
                      Text(f"{_usd(total.missed_dollars)} on "
                           f"{total.requests.get(OUTCOME_MISSED, 0)} requests"
                           + (f"; dominant stage: {_stages(total.missed_by_stage)}"
                              if total.missed_by_stage else "")))
    if report.units_without_inventory:
        units = report.units_without_inventory
        shown = ", ".join(units[:5]) + (f" and {len(units) - 5} more" if len(units) > 5 else "")
        facts.add_row("GPUs assumed (no inventory entry)",
                      Text(f"{len(units)} units priced as their engines' tensor-parallel GPUs: "
                           f"{shown}"))
    console.print(facts)
    if report.slo is not None:
        render_slo(report.slo, console)


def _stages(missed_by_stage: dict[str, int]) -> str:
    ranked = sorted(missed_by_stage.items(), key=lambda item: -item[1])
    return ", ".join(f"{stage} {n}" for stage, n in ranked)


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.3g}"


def render_slo(summary: SloSummary, console: Console) -> None:
    """Per SLO class: outcomes, goodput, dollars per good request, missed dollars."""
    table = Table(title=f"SLO classes: goodput over {summary.window_seconds:.1f} s, "
                        f"{summary.gpus} GPUs billed", title_justify="left")
    objectives = any(c.objective is not None for c in summary.classes)  # config known
    for name, justify in (("class", "left"), ("objective", "right"), ("met", "right"),
                          ("missed", "right"), ("unknown", "right"),
                          ("attainment", "right"), ("goodput/s", "right"),
                          ("goodput/s/GPU", "right"), ("$ per good request", "right"),
                          ("missed $", "right"), ("missed: dominant stage", "left")):
        if name != "objective" or objectives:
            table.add_column(name, justify=justify)  # type: ignore[arg-type]
    rows = [*summary.classes, summary.total()]
    for cls in rows:
        data = cls.to_json(summary.window_seconds, summary.gpus)
        cells = [Text(cls.slo or "all"), _pct(cls.objective)] if objectives else [
            Text(cls.slo or "all")]
        table.add_row(*cells, str(data["met"]),
                      str(data["missed"]), str(data["unknown"]), _pct(cls.attainment),
                      _rate(data["goodput_requests_per_second"]),
                      _rate(data["goodput_per_gpu"]), _usd(cls.dollars_per_good_request),
                      _usd(cls.missed_dollars), Text(_stages(cls.missed_by_stage)))
    console.print(table)


def render_requests(records: Sequence[RequestRecord], console: Console) -> None:
    table = Table(title=f"{len(records)} requests (newest first)", title_justify="left")
    for name, justify in (("trace id", "left"), ("model", "left"), ("in", "right"),
                          ("cached", "right"), ("out", "right"), ("TTFT", "right"),
                          ("duration", "right"), ("cost", "right"), ("complete", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in records:
        # Span-derived text is printed as is: Text() keeps Rich from reading "[...]" in a
        # model name as markup (which could also fail the whole table).
        table.add_row(Text(r.trace_id), Text(r.model), str(r.input_tokens),
                      str(r.cache_read_tokens),
                      str(r.output_tokens), _sec(r.ttft_seconds), _sec(r.duration_seconds),
                      _usd(r.cost_dollars), "yes" if r.complete else "no")
    console.print(table)


def render_leak_ranking(ranked: Sequence[RankedLeak], console: Console) -> None:
    """The leaks by dollars, each with its fix and what it would save (modeled)."""
    table = Table(title="the money leaks, ranked by dollars (savings modeled)",
                  title_justify="left")
    for column, justify in (("#", "right"), ("leak", "left"), ("dollars", "right"),
                            ("fix", "left"), ("would save", "right"), ("how", "left")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for rank, leak in enumerate(ranked, 1):
        table.add_row(str(rank), leak.leak.replace("_", " "), _usd(leak.dollars), leak.fix,
                      _usd(leak.saving_dollars), leak.saving)
    console.print(table)


def render_chargeback(rows: Sequence[ChargebackRow], policy: IdlePolicy, console: Console,
                      title: str = "chargeback by tenant") -> None:
    table = Table(title=f"{title} (idle: {policy.value})", title_justify="left")
    provenance = (combined_energy_provenance(r.energy_provenance for r in rows)
                  or Provenance.MODELED.value)
    slo = any(r.slo_requests for r in rows)  # SLO classes configured
    columns = ["tenant", "requests", "input tokens", "output tokens", "attributed $",
               "idle $", "total $", "share", f"energy kJ ({provenance})"]
    if slo:
        columns += ["met SLO", "$ per good request", "missed-SLO $"]
    for column in columns:
        table.add_column(column, justify="left" if column == "tenant" else "right")
    total = sum(r.total_dollars for r in rows)
    for row in rows:
        cells = [row.tenant, f"{row.requests:,}", f"{row.input_tokens:,}",
                 f"{row.output_tokens:,}", f"${row.cost_dollars:.6f}",
                 f"${row.idle_dollars:.6f}", f"${row.total_dollars:.6f}",
                 f"{row.total_dollars / total:.1%}" if total > 0 else "-",
                 f"{(row.energy_joules + row.idle_energy_joules) / 1e3:,.2f}"]
        if slo:
            per_good = row.dollars_per_good_request
            cells += [f"{row.good_requests:,} of {row.slo_requests:,}",
                      "-" if per_good is None else f"${per_good:.6f}",
                      f"${row.missed_slo_dollars:.6f}"]
        table.add_row(*cells)
    totals = ["total", f"{sum(r.requests for r in rows):,}", "", "",
              f"${sum(r.cost_dollars for r in rows):.6f}",
              f"${sum(r.idle_dollars for r in rows):.6f}", f"${total:.6f}", "",
              f"{sum(r.energy_joules + r.idle_energy_joules for r in rows) / 1e3:,.2f}"]
    if slo:
        totals += [f"{sum(r.good_requests for r in rows):,}", "",
                   f"${sum(r.missed_slo_dollars for r in rows):.6f}"]
    table.add_row(*totals)
    console.print(table)


def render_disaggregated(records: Sequence[RequestRecord], console: Console) -> None:
    """Disaggregated requests by engine: the prefills and decodes each engine ran, the GPU
    dollars its GPUs were paid for them, and the KV cache sent between them (modeled)."""
    from tokenpath.collector.disaggregated import kv_link
    from tokenpath.stages import GPU_STAGES

    rows: dict[tuple[str, str, str], list[float]] = {}  # (role, engine, node) -> [n, $]
    links: dict[str, list[int]] = {}  # link -> [tokens, bytes]
    for r in records:
        if r.kv_transfer_source is None:
            continue
        for role, engine, node, phase in (
                ("prefill", r.prefill_engine_id, r.prefill_node, Phase.PREFILL),
                ("decode", r.decode_engine_id, r.decode_node, Phase.DECODE)):
            dollars = sum(r.stages[s].phases[phase].cost_dollars for s in GPU_STAGES
                          if s in r.stages and phase in r.stages[s].phases)
            row = rows.setdefault((role, engine or "-", node or "-"), [0.0, 0.0])
            row[0] += 1
            row[1] += dollars
        moved = links.setdefault(kv_link(r), [0, 0])
        moved[0] += r.kv_transfer_tokens or 0
        moved[1] += r.kv_transfer_bytes or 0
    if not rows:
        return
    table = Table(title="disaggregated serving: each engine's GPUs paid for what they ran",
                  title_justify="left")
    for column, justify in (("role", "left"), ("engine", "left"), ("node", "left"),
                            ("requests", "right"), ("GPU dollars", "right")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for (role, engine, node), (count, dollars) in sorted(rows.items()):
        table.add_row(role, Text(engine), Text(node), str(int(count)), _usd(dollars))
    console.print(table)
    for link, (tokens, nbytes) in sorted(links.items()):
        console.print(f"KV transfer over {link}: {tokens:,} tokens, {nbytes / 1e9:,.2f} GB "
                      "(modeled: tokens x the model's KV bytes per token)")
