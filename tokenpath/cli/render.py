"""Rich tables for the report and the request list."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tokenpath.collector.cost.leak_ranking import RankedLeak
from tokenpath.leaks import LONG_CONTEXT_TOKENS
from tokenpath.records import RequestRecord
from tokenpath.report import Report
from tokenpath.stages import STAGE_BY_ID, Phase


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
    if report.units_without_inventory:
        units = report.units_without_inventory
        shown = ", ".join(units[:5]) + (f" and {len(units) - 5} more" if len(units) > 5 else "")
        facts.add_row("GPUs assumed (no inventory entry)",
                      Text(f"{len(units)} units priced as their engines' tensor-parallel GPUs: "
                           f"{shown}"))
    console.print(facts)


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
