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
from rich.table import Table

from tokenpath import views
from tokenpath.cli.client import Source, since_unix
from tokenpath.cli.common import console
from tokenpath.cli.query_cmd import COLLECTOR_HELP, STORE_HELP
from tokenpath.collector.cost.chargeback import ChargebackRow, IdlePolicy
from tokenpath.collector.cost.energy import ENERGY_MODELED
from tokenpath.query import Window
from tokenpath.report import combined_energy_provenance

CSV_COLUMNS = ("tenant", "requests", "input_tokens", "output_tokens", "cost_dollars",
               "idle_dollars", "total_dollars", "energy_joules", "idle_energy_joules",
               "energy_provenance")


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


def render_chargeback(rows: Sequence[ChargebackRow], policy: IdlePolicy,
                      title: str = "chargeback by tenant") -> None:
    table = Table(title=f"{title} (idle: {policy.value})", title_justify="left")
    provenance = combined_energy_provenance(r.energy_provenance for r in rows) or ENERGY_MODELED
    for column in ("tenant", "requests", "input tokens", "output tokens", "attributed $",
                   "idle $", "total $", "share", f"energy kJ ({provenance})"):
        table.add_column(column, justify="left" if column == "tenant" else "right")
    total = sum(r.total_dollars for r in rows)
    for row in rows:
        table.add_row(row.tenant, f"{row.requests:,}", f"{row.input_tokens:,}",
                      f"{row.output_tokens:,}", f"${row.cost_dollars:.6f}",
                      f"${row.idle_dollars:.6f}", f"${row.total_dollars:.6f}",
                      f"{row.total_dollars / total:.1%}" if total > 0 else "-",
                      f"{(row.energy_joules + row.idle_energy_joules) / 1e3:,.2f}")
    table.add_row("total", f"{sum(r.requests for r in rows):,}", "", "",
                  f"${sum(r.cost_dollars for r in rows):.6f}",
                  f"${sum(r.idle_dollars for r in rows):.6f}", f"${total:.6f}", "",
                  f"{sum(r.energy_joules + r.idle_energy_joules for r in rows) / 1e3:,.2f}")
    console.print(table)


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
            render_chargeback(rows, idle)
