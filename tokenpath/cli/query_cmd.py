"""``tokenpath report`` and ``tokenpath requests``: read the store or a live collector."""

from __future__ import annotations

import json
from enum import StrEnum

import typer

from tokenpath.cli.client import Source
from tokenpath.cli.common import console
from tokenpath.cli.render import render_leak_ranking, render_report, render_requests
from tokenpath.collector.cost.leak_ranking import rank_leaks
from tokenpath.collector.cost.prices import load_price_sheet
from tokenpath.report import build_report


class OutputFormat(StrEnum):
    TABLE = "table"
    JSON = "json"


STORE_HELP = "Store path (default $TOKENPATH_STORE or ~/.local/share/tokenpath/store.db)."
COLLECTOR_HELP = ("Read from a running collector instead, e.g. http://127.0.0.1:4318; "
                  "several replicas, comma-separated, are merged.")


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report(
        store: str | None = typer.Option(None, help=STORE_HELP),
        collector: str | None = typer.Option(None, help=COLLECTOR_HELP),
        since: str | None = typer.Option(None, help="Only requests that ended in the last "
                                         "DURATION (30s, 5m, 2h, 1d)."),
        format: OutputFormat = typer.Option(OutputFormat.TABLE, "--format"),
    ) -> None:
        """Per-stage latency and cost over the recorded requests."""
        source = Source(store, collector)
        records = source.records(None, since)
        result = build_report(records, source.idle_cost(since))
        ranked = rank_leaks(records, load_price_sheet(None).network_dollars_per_byte)
        if format is OutputFormat.JSON:
            out = result.to_json()
            out["leaks_ranked"] = [leak.to_json() for leak in ranked]
            print(json.dumps(out, indent=2))
        else:
            render_report(result, console)
            if records:
                render_leak_ranking(ranked, console)

    @app.command("requests")
    def requests(
        store: str | None = typer.Option(None, help=STORE_HELP),
        collector: str | None = typer.Option(None, help=COLLECTOR_HELP),
        limit: int = typer.Option(50, min=1, help="How many (newest first)."),
        format: OutputFormat = typer.Option(OutputFormat.TABLE, "--format"),
    ) -> None:
        """The recorded requests, newest first."""
        records = Source(store, collector).records(limit, None)
        if format is OutputFormat.JSON:
            print(json.dumps([r.to_json() for r in records], indent=2))
        else:
            render_requests(records, console)
