"""Entry point: ``tokenpath <command>``."""

from __future__ import annotations

import typer

from tokenpath.cli import (
    agent_cmd,
    chargeback_cmd,
    collector_cmd,
    dashboards_cmd,
    demo_cmd,
    query_cmd,
    whatif_cmd,
)

app = typer.Typer(
    name="tokenpath",
    help="Follow every LLM request along its 15-stage path; latency and dollars per stage.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)



def _print_version(value: bool) -> None:
    if value:
        from tokenpath.install_check import build_state

        typer.echo(build_state().describe())
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True,
        help="Print the version and which core (compiled|python) and OTLP decoder "
             "(native|python) this install runs, then exit."),
) -> None:
    """Follow every LLM request along its 15-stage path; latency and dollars per stage."""


collector_cmd.register(app)
agent_cmd.register(app)
demo_cmd.register(app)
query_cmd.register(app)
whatif_cmd.register(app)
chargeback_cmd.register(app)
app.add_typer(dashboards_cmd.app, name="dashboards")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
