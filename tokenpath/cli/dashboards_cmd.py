"""``tokenpath dashboards build|push``."""

from __future__ import annotations

from pathlib import Path

import typer

from tokenpath.cli.common import auth_token, console, fail
from tokenpath.config import ConfigError

app = typer.Typer(help="Grafana dashboards and Prometheus rules as code.",
                  no_args_is_help=True)

GRAFANA_TOKEN_ENV = "GRAFANA_TOKEN"


def _repository_root() -> Path:
    """The source checkout holding the dashboards package, else the working directory."""
    import tokenpath.dashboards

    checkout = Path(tokenpath.dashboards.__file__).resolve().parent.parent
    return checkout if (checkout / "pyproject.toml").is_file() else Path.cwd()


@app.command("build")
def build(
    ctx: typer.Context,
    output: Path = typer.Option(None, "--output", help="Root to write under (default: cwd)."),
    check: bool = typer.Option(False, "--check",
                               help="Write nothing; exit 1 when a committed file is stale."),
    runbook_base_url: str = typer.Option(None, "--runbook-base-url",
                                         help="Base of the alerts' runbook_url annotations."),
) -> None:
    """Generate dashboards/grafana/*.json, dashboards/rules/*.yml and deploy/k8s/generated."""
    from tokenpath.dashboards import generate, rules

    root = output or _repository_root()
    cli = ctx.find_root().command  # docs/reference.md documents this CLI
    params = (rules.RuleParams(runbook_base_url=runbook_base_url) if runbook_base_url
              else rules.RuleParams())
    if check:
        stale = generate.stale_files(root, params, cli)
        for path in stale:
            console.print(f"stale: {path}")
        if stale:
            raise typer.Exit(1)
        console.print("generated files are up to date")
        return
    for path in generate.write_generated(root, params, cli):
        console.print(f"wrote {path}")


@app.command("budget-rules")
def budget_rules(
    budgets_file: Path = typer.Argument(..., help="Budgets YAML: budgets: {tenant: "
                                        "{dollars: N, per: day|month}}."),
    out: Path = typer.Option(None, "--out", help="Write here (default: standard output)."),
    runbook_base_url: str = typer.Option(None, "--runbook-base-url",
                                         help="Base of the alerts' runbook_url annotations."),
) -> None:
    """Prometheus rules for tenant budgets: multi-window burn-rate alerts."""
    from tokenpath.config import ConfigError
    from tokenpath.dashboards import budgets, rules

    params = (rules.RuleParams(runbook_base_url=runbook_base_url) if runbook_base_url
              else rules.RuleParams())
    try:
        text = budgets.budget_rules_yaml(budgets.load_budgets(budgets_file), params)
    except ConfigError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    if out is None:
        print(text, end="")
    else:
        out.write_text(text, encoding="utf-8")
        console.print(f"wrote {out}")


@app.command("push")
def push(
    grafana_url: str = typer.Option("http://127.0.0.1:3000", "--grafana-url",
                                    envvar="GRAFANA_URL", help="Grafana base URL."),
    token_file: Path = typer.Option(None, "--token-file",
                                    help=f"File with a Grafana service-account token "
                                         f"(else ${GRAFANA_TOKEN_ENV})."),
    folder_uid: str = typer.Option("tokenpath", "--folder-uid"),
    source: Path = typer.Option(Path("dashboards/grafana"), "--dashboards",
                                help="Folder of dashboard JSON files."),
) -> None:
    """Push the dashboard JSON files to Grafana (folder created when missing)."""
    import os

    from tokenpath.dashboards.push import DashboardPusher, PushConfig, PushError

    token = (auth_token(token_file, "--token-file") if token_file
             else os.environ.get(GRAFANA_TOKEN_ENV))
    paths = sorted(source.glob("*.json"))
    if not paths:
        fail(f"--dashboards: no *.json under {source}")
    try:
        pusher = DashboardPusher(PushConfig(url=grafana_url, token=token or None,
                                            folder_uid=folder_uid))
        pushed = pusher.push_files(paths)
    except ConfigError as exc:
        fail(str(exc))
    except PushError as exc:
        fail(str(exc), code=1)
    for item in pushed:
        console.print(f"pushed {item.uid} (version {item.version}) {item.url}")
