"""``tokenpath chargeback``: the window's dollars by tenant, idle included by a policy.

Rows sum to the window's attributed plus idle dollars (collector/cost/chargeback.py has
the policy and the formulas; docs/chargeback.md explains them).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from enum import StrEnum

import typer

from tokenpath import views
from tokenpath.cli.client import Source, since_unix
from tokenpath.cli.common import COLLECTOR_HELP, STORE_HELP, console
from tokenpath.cli.render import render_chargeback
from tokenpath.collector.cost.chargeback import ChargebackRow, IdlePolicy
from tokenpath.query import Window

CSV_COLUMNS = ("tenant", "requests", "input_tokens", "output_tokens", "cost_dollars",
               "idle_dollars", "total_dollars", "energy_joules", "idle_energy_joules",
               "energy_provenance", "good_requests", "missed_slo_dollars",
               "dollars_per_good_request")


class ChargebackFormat(StrEnum):
    TABLE = "table"
    CSV = "csv"
    JSON = "json"


def chargeback_csv(rows: Sequence[ChargebackRow]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in rows:
        data = row.to_json()
        writer.writerow([data[column] for column in CSV_COLUMNS])
    return out.getvalue()


def register(app: typer.Typer) -> None:
    @app.command("chargeback")
    def chargeback_command(
        store: str | None = typer.Option(None, help=STORE_HELP),
        collector: str | None = typer.Option(None, help=COLLECTOR_HELP),
        since: str | None = typer.Option(None, help="Only requests that ended in the last "
                                         "DURATION (30d, 24h, ...)."),
        idle: IdlePolicy = typer.Option(IdlePolicy.PROPORTIONAL, "--idle",
                                        help="Idle GPU dollars: proportional to each "
                                             "tenant's attributed dollars, or a platform row."),
        format: ChargebackFormat = typer.Option(ChargebackFormat.TABLE, "--format"),
    ) -> None:
        """Dollars by tenant over the window: attributed plus allocated idle."""
        with Source(store, collector).queries() as opened:
            rows = views.chargeback_view(opened, Window(since_unix(since)), idle)
        if format is ChargebackFormat.JSON:
            print(json.dumps({"idle_policy": idle.value, "rows": [r.to_json() for r in rows],
                              "total_dollars": sum(r.total_dollars for r in rows)}, indent=2))
        elif format is ChargebackFormat.CSV:
            print(chargeback_csv(rows), end="")
        else:
            render_chargeback(rows, idle, console)
