"""``tokenpath collector``: OTLP in, requests joined, Prometheus and store out."""

from __future__ import annotations

import typer

from tokenpath.cli.common import not_yet_available


def register(app: typer.Typer) -> None:
    @app.command("collector")
    def collector() -> None:
        """Run the collector."""
        not_yet_available("collector", "1/9")
