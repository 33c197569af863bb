"""Helpers every command shares: the console, exit on bad input, auth token lookup."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from tokenpath.endpoints import COLLECTOR_URL

AUTH_TOKEN_ENV = "TOKENPATH_AUTH_TOKEN"

# Piped output (CI logs, `make demo | tee`) gets room for the 15-stage table instead of
# rich's 80-column default; a terminal (or $COLUMNS) keeps its own width.
PIPED_WIDTH = 140
console = Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS")
                  else PIPED_WIDTH)
err_console = Console(stderr=True)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print a clear error and exit non-zero (no traceback)."""
    # not folded at the console's width: a path or URL in it pastes back whole
    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)


def auth_token(token_file: Path | None = None, flag: str = "--auth-token-file") -> str | None:
    """The bearer token from the file ``flag`` names, or ``TOKENPATH_AUTH_TOKEN``."""
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            fail(f"{flag}: cannot read {token_file}: {exc.strerror or exc}")
        if not token:
            fail(f"{flag}: {token_file} is empty")
        return token
    value = os.environ.get(AUTH_TOKEN_ENV, "").strip()
    return value or None


STORE_HELP = ("Store path (default $TOKENPATH_STORE or ~/.local/share/tokenpath/store.db), "
              "or chdb:///PATH, clickhouse[s]://[USER@]HOST[:PORT]/DB.")
COLLECTOR_HELP = (f"Read from a running collector instead, e.g. {COLLECTOR_URL}; "
                  "several replicas, comma-separated, are merged.")
