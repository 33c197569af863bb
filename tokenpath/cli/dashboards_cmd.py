"""``tokenpath dashboards build|push`` (issue 6/9)."""

from __future__ import annotations

import typer

from tokenpath.cli.common import not_yet_available

app = typer.Typer(help="Grafana dashboards as code.", no_args_is_help=True)


@app.command("build")
def build() -> None:
    """Generate dashboards/grafana/*.json and the rule files."""
    not_yet_available("dashboards build", "6/9")


@app.command("push")
def push() -> None:
    """Push the dashboards to Grafana."""
    not_yet_available("dashboards push", "6/9")
