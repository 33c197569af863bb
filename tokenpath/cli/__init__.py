"""The ``tokenpath`` command line (typer + rich). One module per command family."""
