"""The ground-truth writer of docs/reference.md: what the simulated engine knows each request
cost on the GPU, as JSON lines ``{trace_id, gpu_cost_dollars, gpu_seconds}``.

``gpu_seconds`` is the request's share of every engine step it took part in (each step's
measured duration split among its sequences by their roofline work,
:meth:`tokenpath.roofline.Roofline.sequence_work`); ``gpu_cost_dollars`` is that times the
price per second of the GPUs the replica occupies (price per GPU-hour x tensor parallel).
The collector never reads this file; tests and benchmarks compare its attribution to it.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import IO, Any

# H100 SXM on-demand, order of magnitude of large clouds' list prices in 2024-2025
# (e.g. AWS p5.48xlarge ~ $98/h for 8 GPUs = ~$12/GPU-h; specialist clouds $2-4/GPU-h).
# The demo uses a mid value; pass your own rate.
DEFAULT_GPU_DOLLARS_PER_HOUR = 4.0


class GroundTruthWriter:
    """Appends one JSON line per finished request; thread-safe; ``shutdown`` closes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        self.written = 0

    def start(self) -> None:
        with self._lock:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = self.path.open("a", encoding="utf-8")

    def write(self, trace_id: str, gpu_seconds: float, gpu_cost_dollars: float,
              engine: str | None = None, node: str | None = None,
              kv_transfer_tokens: int | None = None,
              kv_transfer_bytes: int | None = None) -> None:
        """One engine's part of a request; a disaggregated request has two rows (its
        prefill engine's and its decode engine's, the latter with the KV it received)."""
        row: dict[str, object] = {
            "trace_id": trace_id,
            "gpu_cost_dollars": gpu_cost_dollars,
            "gpu_seconds": gpu_seconds,
        }
        if engine is not None:
            row["engine"] = engine
        if node is not None:
            row["node"] = node
        if kv_transfer_tokens is not None:
            row["kv_transfer_tokens"] = kv_transfer_tokens
            row["kv_transfer_bytes"] = kv_transfer_bytes
        line = json.dumps(row)
        with self._lock:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = self.path.open("a", encoding="utf-8")
            self._file.write(line + "\n")
            self._file.flush()
            self.written += 1

    def shutdown(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def read_ground_truth(path: str | Path) -> dict[str, dict[str, float]]:
    """``{trace_id: {gpu_seconds, gpu_cost_dollars}}`` from a ground-truth file (a
    request's rows summed: a disaggregated request has one per engine)."""
    out: dict[str, dict[str, float]] = {}
    for row in read_ground_truth_rows(path):
        totals = out.setdefault(str(row["trace_id"]), {"gpu_seconds": 0.0,
                                                       "gpu_cost_dollars": 0.0})
        totals["gpu_seconds"] += float(row["gpu_seconds"])
        totals["gpu_cost_dollars"] += float(row["gpu_cost_dollars"])
    return out


def read_ground_truth_rows(path: str | Path) -> list[dict[str, Any]]:
    """Every row of a ground-truth file, as written: one per engine a request ran on."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()
            if line.strip()]
