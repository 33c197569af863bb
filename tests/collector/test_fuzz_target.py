"""The atheris target (fuzz/otlp_fuzz.py) keeps working without atheris installed."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path
from types import ModuleType

from testkit.support.otlp import export_request, request_span, to_otlp_json

TARGET = Path(__file__).resolve().parents[2] / "fuzz" / "otlp_fuzz.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("otlp_fuzz", TARGET)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fuzz_target_runs_on_seeds() -> None:
    target = _load()
    valid = export_request([request_span()])
    rng = random.Random(1)
    seeds = [b"", b"{}", valid.SerializeToString(), to_otlp_json(valid),
             *(rng.randbytes(rng.randint(1, 300)) for _ in range(300))]
    for seed in seeds:
        target.test_one_input(seed)
