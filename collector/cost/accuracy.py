"""How close the attributed GPU cost is to a ground truth (the simulated engine's).

A record's GPU cost is the sum of its gpu_dispatch, hbm_load, kernel_exec and nvlink stage
costs (``RequestRecord.gpu_cost_dollars``). The naive figure (wall-clock x $/s x GPUs, as
gateway tools count) is compared the same way.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tokenpath.records import RequestRecord


def read_ground_truth(source: str | Path | Iterable[dict[str, Any]]) -> dict[str, float]:
    """trace_id -> gpu_cost_dollars from a JSON-lines file or already parsed rows (the
    rows of one trace summed: the engines of a disaggregated request each write one)."""
    if isinstance(source, str | Path):
        rows: Iterable[dict[str, Any]] = (
            json.loads(line) for line in Path(source).read_text(encoding="utf-8").splitlines()
            if line.strip()
        )
    else:
        rows = source
    out: dict[str, float] = {}
    for row in rows:  # a disaggregated request has a row per engine: its GPU cost is both
        trace_id = str(row["trace_id"])
        out[trace_id] = out.get(trace_id, 0.0) + float(row["gpu_cost_dollars"])
    return out


def _relative(estimate: float, truth: float) -> float:
    return abs(estimate - truth) / truth


def compare_to_ground_truth(
    records: Iterable[RequestRecord],
    ground_truth_jsonl: str | Path | Iterable[dict[str, Any]],
) -> dict[str, float]:
    """Median relative errors of attributed and naive GPU cost over complete records."""
    truth = read_ground_truth(ground_truth_jsonl)
    errors: list[float] = []
    naive: list[float] = []
    for record in records:
        expected = truth.get(record.trace_id)
        if not record.complete or expected is None or expected <= 0:
            continue
        errors.append(_relative(record.gpu_cost_dollars, expected))
        naive.append(_relative(record.naive_cost_dollars, expected))
    if not errors:
        raise ValueError("no complete record matches the ground truth")
    median = statistics.median(errors)
    naive_median = statistics.median(naive)
    return {
        "matched": float(len(errors)),
        "median_rel_error": median,
        "p90_rel_error": statistics.quantiles(errors, n=10)[-1] if len(errors) > 1 else median,
        "naive_median_rel_error": naive_median,
        "ratio_to_naive": median / naive_median if naive_median > 0 else float("inf"),
    }
