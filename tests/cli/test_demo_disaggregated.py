"""`tokenpath demo --disaggregated`: each request one record naming its prefill and decode
engines; per engine, its GPU dollars within 5% (median) of the simulator's ground truth;
every node's dollars conserved; the KV transfer's bytes the simulator's."""

from __future__ import annotations

import io
import json
import math
import statistics
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from tokenpath.cli.demo_cmd import DemoConfig, run_demo
from tokenpath.cli.main import app
from tokenpath.instrumentation.reference.ground_truth import read_ground_truth_rows
from tokenpath.stages import GPU_STAGES

pytestmark = pytest.mark.integration


def test_demo_disaggregated_prices_each_engine_like_its_ground_truth(tmp_path: Path) -> None:
    store, truth = tmp_path / "store.db", tmp_path / "truth.jsonl"
    out = io.StringIO()
    result = run_demo(DemoConfig(
        duration=4.0, rps=6.0, store_path=str(store), ground_truth=truth,
        collector_host="127.0.0.1", collector_port=0, agent_listen="127.0.0.1:0",
        time_scale=0.25, replicas=2, disaggregated=True), Console(file=out, width=200))
    printed = out.getvalue()
    assert "prefill and 2 decode engines" in printed
    assert "KV transfer over network" in printed
    # the records as a user reads them: tokenpath requests --format json
    listed = CliRunner().invoke(app, ["requests", "--store", str(store), "--format", "json",
                                      "--limit", "10000"])
    assert listed.exit_code == 0, listed.output
    records = json.loads(listed.output)
    rows: dict[str, dict[str, dict[str, object]]] = {}
    for row in read_ground_truth_rows(truth):
        rows.setdefault(str(row["trace_id"]), {})[str(row["engine"]).split("-")[0]] = row
    assert len(records) >= 5
    assert {r["trace_id"] for r in records} == set(rows)  # one record per request
    errors: dict[str, list[float]] = {"prefill": [], "decode": []}
    for record in records:
        engines = rows[record["trace_id"]]
        assert record["prefill_engine_id"] == engines["prefill"]["engine"]
        assert record["decode_engine_id"] == engines["decode"]["engine"]
        assert record["kv_transfer_tokens"] == engines["decode"]["kv_transfer_tokens"]
        assert record["kv_transfer_bytes"] == engines["decode"]["kv_transfer_bytes"]
        assert 0 < record["kv_transfer_tokens"] <= record["input_tokens"]
        for role in errors:
            truth_dollars = float(engines[role]["gpu_cost_dollars"])  # type: ignore[arg-type]
            paid = sum(record["stages"][s.value]["phases"].get(role, {}).get(
                "cost_dollars", 0.0) for s in GPU_STAGES
                if s.value in record["stages"] and "phases" in record["stages"][s.value])
            if truth_dollars > 0:
                errors[role].append(abs(paid - truth_dollars) / truth_dollars)
    for role, found in errors.items():
        assert statistics.median(found) <= 0.05, (role, statistics.median(found))
    assert {name.rsplit("-", 2)[-2] for name in result.ledger} == {"prefill", "decode"}
    for name, node in result.ledger.items():
        assert math.isclose(node.node_dollars, node.attributed_dollars + node.idle_dollars,
                            rel_tol=1e-9, abs_tol=1e-12), name
