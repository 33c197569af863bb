"""The same OTLP traffic into two `tokenpath collector` processes, one with the SQLite store
and one with ``--store chdb:///PATH``, gives the same `tokenpath report`; while the chDB
collector runs, the CLI given its folder says a collector has it and names
``--collector URL``. Skipped when chdb cannot be imported."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("chdb")
pytest.importorskip("clickhouse_connect")

from tests.core.test_views import QUANTILE_KEYS, close
from tests.dashboards.otlp_workload import CollectorProcess, export_spans, request_trace

pytestmark = pytest.mark.integration

TRACES = 60
MODELS = ("llama-3-8b", "qwen-2-7b", "mistral-7b")


def _cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tokenpath.cli.main", *args],
                          capture_output=True, text=True, timeout=120, check=check)


def _report(store: str) -> dict[str, Any]:
    return dict(json.loads(_cli("report", "--store", store, "--format", "json").stdout))


def _wait_for(collector: CollectorProcess, records: int) -> None:
    deadline = time.monotonic() + 60
    seen = -1
    while time.monotonic() < deadline:
        summary = httpx.get(f"{collector.http_url}/api/summary", timeout=10).json()
        seen = int(summary.get("requests") or 0)
        if seen >= records:
            return
        time.sleep(0.3)
    raise AssertionError(f"{seen} of {records} records: {collector.log.read_text()[-2000:]}")


def test_a_chdb_collector_reports_as_a_sqlite_one(tmp_path: Path) -> None:
    folder = tmp_path / "chstore"
    sqlite = CollectorProcess(tmp_path, "sqlite")
    chdb = CollectorProcess(tmp_path, "chdb", store=f"chdb://{folder}")
    try:
        sqlite.wait_ready()
        chdb.wait_ready()
        rng = random.Random(21)
        now_ns = time.time_ns() - 120 * 10**9
        for i in range(TRACES):
            _, spans = request_trace(rng, MODELS[i % len(MODELS)], now_ns + i * 10**9)
            for collector in (sqlite, chdb):
                export_spans(collector.http_url, spans)
        for collector in (sqlite, chdb):
            _wait_for(collector, TRACES)
        # the collector owns the folder: the CLI says so and names its API
        held = _cli("report", "--store", f"chdb://{folder}", "--format", "json", check=False)
        assert held.returncode != 0
        assert f"--collector {chdb.http_url}" in held.stdout + held.stderr
        live = json.loads(_cli("report", "--collector", chdb.http_url, "--format",
                               "json").stdout)
        assert live["requests"] == TRACES
    finally:
        sqlite.stop()
        chdb.stop()
    mine = _report(f"chdb://{folder}")
    theirs = _report(str(sqlite.store))
    assert mine["requests"] == theirs["requests"] == TRACES
    close(mine, theirs, "report", frozenset(QUANTILE_KEYS))
