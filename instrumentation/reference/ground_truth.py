"""The ground-truth writer of SPEC section 4: what the simulated engine knows each request
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
from typing import IO

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

    def write(self, trace_id: str, gpu_seconds: float, gpu_cost_dollars: float) -> None:
        line = json.dumps({
            "trace_id": trace_id,
            "gpu_cost_dollars": gpu_cost_dollars,
            "gpu_seconds": gpu_seconds,
        })
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
    """``{trace_id: {gpu_seconds, gpu_cost_dollars}}`` from a ground-truth file."""
    out: dict[str, dict[str, float]] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            out[row["trace_id"]] = {
                "gpu_seconds": float(row["gpu_seconds"]),
                "gpu_cost_dollars": float(row["gpu_cost_dollars"]),
            }
    return out
