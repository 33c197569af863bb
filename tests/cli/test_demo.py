"""`tokenpath demo` end to end (time-scaled): reference path -> OTLP -> collector -> report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tokenpath.cli.main import app
from tokenpath.instrumentation.reference.ground_truth import read_ground_truth
from tokenpath.stages import STAGE_IDS, Phase, StageId

pytestmark = pytest.mark.integration


def _demo(tmp: Path, shared_prefix: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    store = tmp / f"store-{shared_prefix}.db"
    truth = tmp / f"truth-{shared_prefix}.jsonl"
    # as a user runs it: its own process (and its own event loop)
    result = subprocess.run(
        [sys.executable, "-m", "tokenpath.cli.main", "demo", "--duration", "3", "--rps", "8",
         "--time-scale", "0.02", "--shared-prefix", str(shared_prefix), "--store", str(store),
         "--ground-truth", str(truth), "--collector-http", "127.0.0.1:0",
         "--agent-listen", "127.0.0.1:0",
         # no routing or eviction misses: the hit ratio measures the sharing alone (the
         # default demo's leaks are tests/cli/test_demo_leaks.py's)
         "--router", "prefix_affine", "--kv-blocks", "100000"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "simulated engine" in result.stdout
    assert "agent     http://127.0.0.1:" in result.stdout  # the node agent ran alongside
    # A collector on a free port (0) is not one to reopen: the closing line suggests the
    # default listener and its URL.
    closing = " ".join(result.stdout.split())
    assert f"tokenpath collector --store {store} and open the UI at " \
           "http://127.0.0.1:4318/" in closing, closing[-400:]
    runner = CliRunner()
    report = runner.invoke(app, ["report", "--store", str(store), "--format", "json"])
    assert report.exit_code == 0, report.output
    requests = runner.invoke(app, ["requests", "--store", str(store), "--format", "json",
                                   "--limit", "10000"])
    assert requests.exit_code == 0, requests.output
    records = json.loads(requests.output)
    assert set(read_ground_truth(truth)) == {r["trace_id"] for r in records}
    return json.loads(report.output), records


def test_demo_reports_all_15_stages_and_prefix_sharing_raises_the_hit_ratio(
    tmp_path: Path,
) -> None:
    low, _ = _demo(tmp_path, 0.2)
    high, records = _demo(tmp_path, 0.9)
    for report in (low, high):
        assert report["requests"] > 5
        stages = report["stages"]
        assert [s["stage"] for s in stages] == [s.value for s in STAGE_IDS]
        for summary in stages:  # nvlink too: the demo runs tensor parallel 4
            assert summary["provenance"] in ("measured", "derived", "modeled"), summary
            assert summary["p50_seconds"] is not None, summary
        by_stage = {s["stage"]: s for s in stages}
        # prefill and decode kept apart
        assert report["prefill_seconds"] > 0 and report["decode_seconds"] > 0
        assert by_stage[StageId.KERNEL_EXEC.value]["phases"][Phase.PREFILL.value]["seconds"] > 0
        assert by_stage[StageId.HBM_LOAD.value]["phases"][Phase.DECODE.value]["seconds"] > 0
        assert set(by_stage[StageId.GPU_DISPATCH.value]["phases"]) == {"prefill", "decode"}
        assert 0.0 < report["prefix_cache_hit_ratio"] < 1.0
        # the report's documented fields, with real values from the cost attributor
        assert report["window_seconds"] > 0 and report["output_tokens_per_second"] > 0
        assert 0 < report["ttft_p50_seconds"] <= report["ttft_p95_seconds"]
        assert report["cost_dollars"] > 0 and report["idle_cost_dollars"] >= 0
        assert report["cache_miss_waste_dollars"] >= 0
        assert report["cost_per_million_output_tokens"] > 0
        for stage in (StageId.GPU_DISPATCH, StageId.HBM_LOAD, StageId.KERNEL_EXEC):
            assert by_stage[stage.value]["cost_dollars"] > 0, stage
        assert report["cost_dollars"] == pytest.approx(
            sum(s["cost_dollars"] for s in stages), rel=1e-6)
    assert high["prefix_cache_hit_ratio"] > low["prefix_cache_hit_ratio"]
    assert all(r["simulated"] for r in records)
    assert all(len(r["trace_id"]) == 32 for r in records)


@pytest.mark.parametrize(("args", "flag"), [
    (["--rps", "0"], "--rps"),
    (["--time-scale", "0"], "--time-scale"),
    (["--shared-prefix", "2"], "--shared-prefix"),
    (["--collector-http", "nonsense"], "--collector-http"),
    (["--model", "gpt-9"], "--model"),
    (["--engine", "vllm", "--ground-truth", "x.jsonl"], "--ground-truth"),
])
def test_demo_rejects_bad_options_naming_the_flag(args: list[str], flag: str) -> None:
    result = CliRunner().invoke(app, ["demo", *args])
    assert result.exit_code != 0
    assert flag in result.output
