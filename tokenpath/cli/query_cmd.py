"""``tokenpath report`` and ``tokenpath requests``: read the store or a live collector."""

from __future__ import annotations

import json
from collections.abc import Callable
from enum import StrEnum

import typer

from tokenpath import views
from tokenpath.cli.client import Source, since_unix
from tokenpath.cli.common import console
from tokenpath.cli.render import render_leak_ranking, render_report, render_requests
from tokenpath.collector.cost.chargeback import IdlePolicy
from tokenpath.collector.cost.prices import load_price_sheet
from tokenpath.endpoints import COLLECTOR_URL
from tokenpath.query import Window
from tokenpath.records import RequestRecord


class OutputFormat(StrEnum):
    TABLE = "table"
    JSON = "json"


class GroupBy(StrEnum):
    TENANT = "tenant"
    MODEL = "model"
    POOL = "pool"


GROUP_KEYS: dict[GroupBy, Callable[[RequestRecord], str | None]] = {
    GroupBy.TENANT: lambda r: r.tenant,
    GroupBy.MODEL: lambda r: r.model,
    GroupBy.POOL: lambda r: r.pool,
}

STORE_HELP = ("Store path (default $TOKENPATH_STORE or ~/.local/share/tokenpath/store.db), "
              "or chdb:///PATH, clickhouse[s]://[USER@]HOST[:PORT]/DB.")
COLLECTOR_HELP = (f"Read from a running collector instead, e.g. {COLLECTOR_URL}; "
                  "several replicas, comma-separated, are merged.")


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report(
        store: str | None = typer.Option(None, help=STORE_HELP),
        collector: str | None = typer.Option(None, help=COLLECTOR_HELP),
        since: str | None = typer.Option(None, help="Only requests that ended in the last "
                                         "DURATION (30s, 5m, 2h, 1d)."),
        format: OutputFormat = typer.Option(OutputFormat.TABLE, "--format"),
        by: GroupBy | None = typer.Option(None, "--by", help="Also the dollars by tenant "
                                          "(idle allocated proportionally), model or pool."),
    ) -> None:
        """Per-stage latency and cost over the recorded requests."""
        dollars_per_byte = load_price_sheet(None).network_dollars_per_byte
        # one way for a store file, one collector or N replicas: views on their aggregates
        with Source(store, collector).queries() as opened:
            window = Window(since_unix(since))
            result = views.report_view(opened, window)
            ranked = (views.rank_leaks_view(opened, window, dollars_per_byte)
                      if result.requests else [])
            groups = None if by is None else views.chargeback_view(
                opened, window, IdlePolicy.PROPORTIONAL, by.value)
        if format is OutputFormat.JSON:
            out = result.to_json()
            out["leaks_ranked"] = [leak.to_json() for leak in ranked]
            if by is not None and groups is not None:
                out["by"] = by.value
                out["groups"] = [{"group": g.tenant, **g.to_json()} for g in groups]
            print(json.dumps(out, indent=2))
        else:
            render_report(result, console)
            if result.requests:
                render_leak_ranking(ranked, console)
            if by is not None and groups is not None:
                from tokenpath.cli.chargeback_cmd import render_chargeback

                render_chargeback(groups, IdlePolicy.PROPORTIONAL, f"dollars by {by.value}")

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
