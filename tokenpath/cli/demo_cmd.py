"""``tokenpath demo``: the reference serving path, collector and agent (issue 2/9)."""

from __future__ import annotations

import typer

from tokenpath.cli.common import not_yet_available


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo() -> None:
        """Run the reference serving path with a workload and print the stage report."""
        not_yet_available("demo", "2/9")
