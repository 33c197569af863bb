"""`tokenpath dashboards push` through grafana-client against a local HTTP double of the
documented Grafana endpoints (testkit/fakes/grafana_api.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from testkit.fakes.grafana_api import GrafanaDouble
from tokenpath.cli.main import app
from tokenpath.dashboards import generate
from tokenpath.dashboards.definitions import DASHBOARDS
from tokenpath.dashboards.push import DashboardPusher, PushConfig, PushError

REPO = Path(__file__).resolve().parents[2]
TOKEN = "service-account-token"


@pytest.fixture
def grafana() -> Iterator[GrafanaDouble]:
    double = GrafanaDouble(token=TOKEN)
    double.start()
    yield double
    double.shutdown()


def _paths() -> list[Path]:
    return sorted((REPO / generate.GRAFANA_DIR).glob("*.json"))


def test_push_creates_folder_and_posts_every_dashboard(grafana: GrafanaDouble) -> None:
    pushed = DashboardPusher(PushConfig(url=grafana.url, token=TOKEN)).push_files(_paths())
    assert {p.uid for p in pushed} == {d.uid for d in DASHBOARDS}
    assert set(grafana.folders) == {"tokenpath"}
    for path in _paths():
        committed = json.loads(path.read_text("utf-8"))
        stored = grafana.dashboards[committed["uid"]]
        assert stored["folderUid"] == "tokenpath"
        assert stored["dashboard"]["panels"] == committed["panels"]
    assert ("GET", "/api/health") in grafana.requests


def test_push_twice_overwrites_and_reuses_the_folder(grafana: GrafanaDouble) -> None:
    pusher = DashboardPusher(PushConfig(url=grafana.url, token=TOKEN))
    pusher.push_files(_paths())
    second = pusher.push_files(_paths())
    assert all(p.version == 2 for p in second)
    assert [r for r in grafana.requests if r == ("POST", "/api/folders")] == [
        ("POST", "/api/folders")]


def test_push_with_a_wrong_token_fails_clearly(grafana: GrafanaDouble) -> None:
    with pytest.raises(PushError, match="folder lookup failed"):
        DashboardPusher(PushConfig(url=grafana.url, token="wrong")).push_files(_paths())
    assert grafana.dashboards == {}


def test_push_to_unreachable_grafana_raises_push_error() -> None:
    double = GrafanaDouble()
    url = double.url
    double.shutdown()
    with pytest.raises(PushError, match=r"cannot reach Grafana|health check failed"):
        DashboardPusher(PushConfig(url=url, timeout_seconds=2.0)).push_files(_paths())


def test_push_command(grafana: GrafanaDouble, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n", encoding="utf-8")
    result = CliRunner().invoke(app, [
        "dashboards", "push", "--grafana-url", grafana.url, "--token-file", str(token_file),
        "--dashboards", str(REPO / generate.GRAFANA_DIR)])
    assert result.exit_code == 0, result.output
    assert set(grafana.dashboards) == {d.uid for d in DASHBOARDS}


def test_push_command_rejects_a_bad_url() -> None:
    result = CliRunner().invoke(app, ["dashboards", "push", "--grafana-url", "grafana:3000",
                                      "--dashboards", str(REPO / generate.GRAFANA_DIR)])
    assert result.exit_code == 2


def test_push_command_names_its_own_flag_for_an_unreadable_token_file(tmp_path: Path) -> None:
    for token_file in (tmp_path / "missing", tmp_path / "empty"):
        if token_file.name == "empty":
            token_file.write_text("\n", encoding="utf-8")
        result = CliRunner().invoke(app, [
            "dashboards", "push", "--grafana-url", "http://127.0.0.1:9",
            "--token-file", str(token_file), "--dashboards", str(REPO / generate.GRAFANA_DIR)])
        assert result.exit_code != 0
        assert "--token-file:" in result.output and "--auth-token-file" not in result.output
