"""``tokenpath whatif``: projections from the roofline model (issue 4/9)."""

from __future__ import annotations

import typer

from tokenpath.cli.common import not_yet_available


def register(app: typer.Typer) -> None:
    @app.command("whatif")
    def whatif() -> None:
        """Project cost and throughput under better caching, batching or spec decoding."""
        not_yet_available("whatif", "4/9")
