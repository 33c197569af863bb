"""``tokenpath report`` and ``tokenpath requests``: read the store or a live collector."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    del app
