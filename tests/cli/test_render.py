"""How the CLI prints money: a cost that is not zero never reads as zero."""

from __future__ import annotations

from tokenpath.cli.render import _usd


def test_dollars_keep_three_significant_digits_below_a_cent() -> None:
    assert _usd(None) == "-"
    assert _usd(0.0) == "$0"
    assert _usd(2.26e-7) == "$2.26e-07"
    assert _usd(0.004567) == "$0.00457"
    assert _usd(0.0123) == "$0.0123"
    assert _usd(1234.5) == "$1,234.5000"


def test_the_report_prints_each_slo_class_and_the_missed_dollars_beside_the_leaks() -> None:
    import io

    from rich.console import Console

    from tokenpath import views
    from tokenpath.cli.render import render_report
    from tokenpath.query import Window
    from tokenpath.records import RequestRecord

    def record(i: int, slo: str, outcome: str, stage: str | None, cost: float) -> RequestRecord:
        return RequestRecord(trace_id=f"{i:032x}", model="m", start_unix=100.0 + i,
                             end_unix=101.0 + i, cost_dollars=cost, slo=slo,
                             slo_outcome=outcome, slo_miss_stage=stage, tensor_parallel=2)

    records = [record(0, "interactive", "met", None, 0.01),
               record(1, "interactive", "missed", "queue", 0.02),
               record(2, "interactive", "missed", "prefill", 0.04),
               record(3, "batch", "met", None, 0.08)]
    with views.over_records(records) as queries:
        report = views.report_view(queries, Window())
    out = io.StringIO()
    render_report(report, Console(file=out, width=200))
    text = out.getvalue()
    assert "missed-SLO dollars (overlaps the leaks; not added to them)  $0.0600 on 2 " \
           "requests; dominant stage: queue 1, prefill 1" in text
    assert "SLO classes: goodput over 4.0 s, 2 GPUs billed" in text
    rows = {line.split("│")[1].strip(): line for line in text.splitlines()
            if line.startswith("│")}
    assert set(rows) >= {"interactive", "batch", "all"}
    # interactive: 1 met of 3, its $0.07 over that one good request
    assert "$0.0700" in rows["interactive"] and "33.3%" in rows["interactive"]
    assert "queue 1, prefill 1" in rows["interactive"]
