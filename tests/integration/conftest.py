"""The modules that start vLLM engines (marked ``vllm``) take turns: vLLM's CPU build
takes every core it is given, and two modules' engines side by side on a small machine
(xdist runs a module to a worker) only make both slow enough to time out. An exclusive
file lock, held for the whole module, serializes them across the workers."""

from __future__ import annotations

import fcntl
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

LOCK_FILE = Path(tempfile.gettempdir()) / "tokenpath-vllm-engines.lock"


@pytest.fixture(scope="module", autouse=True)
def vllm_engines_one_module_at_a_time(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("vllm") is None:
        yield
        return
    with LOCK_FILE.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield
