"""The compiled core (tokenpath/compiled.py): built by make, switchable off, and not a
second authority: it prices engine traffic to the same bytes as the plain Python."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.core.compiled_core_digest import write_payloads
from tokenpath import compiled

REPO = Path(__file__).resolve().parents[2]
BUILT = os.environ.get(compiled.COMPILE_ENV, "1") != "0"


def _run(code_or_module: list[str], pure: bool, **kwargs: object) -> str:
    env = {k: v for k, v in os.environ.items() if k != compiled.PURE_PYTHON_ENV}
    if pure:
        env[compiled.PURE_PYTHON_ENV] = "1"
    done = subprocess.run([sys.executable, *code_or_module], env=env, cwd=REPO,
                          capture_output=True, text=True, check=True, timeout=600)
    return done.stdout


@pytest.mark.skipif(not BUILT, reason="TOKENPATH_COMPILE=0: built as plain Python")
def test_every_listed_module_runs_compiled() -> None:
    # make venv builds them; a stale or missing extension would leave some plain
    assert compiled.compiled_modules() == list(compiled.COMPILED_MODULES)
    assert compiled.describe().startswith("compiled")


# Built once per record or per slice; a dataclass's generated __init__ would run them as
# interpreted Python (tokenpath/records.py).
PER_RECORD_CLASSES = (
    ("tokenpath.records", "PhaseShare"), ("tokenpath.records", "StageTiming"),
    ("tokenpath.records", "RequestRecord"),
    ("tokenpath.collector.assembler", "AssembledTrace"),
    ("tokenpath.collector.assembler", "_Pending"),
    ("tokenpath.collector.cost.apportion", "EngineInterval"),
    ("tokenpath.collector.cost.apportion", "LateCharge"),
    ("tokenpath.collector.cost.apportion", "ClosedSlice"),
    ("tokenpath.collector.cost.apportion", "SliceResult"),
    ("tokenpath.collector.cost.attributor", "_Pending"),
    ("tokenpath.collector.cost.cache", "_Seen"),
)


@pytest.mark.skipif(not BUILT, reason="TOKENPATH_COMPILE=0: built as plain Python")
@pytest.mark.parametrize(("module", "name"), PER_RECORD_CLASSES)
def test_per_record_classes_construct_in_compiled_code(module: str, name: str) -> None:
    cls = getattr(importlib.import_module(module), name)
    assert not inspect.isfunction(cls.__init__), f"{module}.{name}.__init__ is Python"


def test_the_switch_runs_every_module_from_its_source() -> None:
    out = _run(["-c", "import json, tokenpath.compiled as c; "
                "print(json.dumps([c.compiled_modules(), c.describe()]))"], pure=True)
    modules, description = json.loads(out)
    assert modules == []
    assert description == f"pure Python ({compiled.PURE_PYTHON_ENV}=1)"


def test_compiled_and_plain_python_price_engine_traffic_to_the_same_bytes(
        tmp_path: Path) -> None:
    payloads = tmp_path / "payloads.pickle"
    write_payloads(payloads)
    digest = ["-m", "tests.core.compiled_core_digest", str(payloads)]
    as_built = json.loads(_run(digest, pure=False))
    plain = json.loads(_run(digest, pure=True))
    assert plain["core"].startswith("pure Python")
    if BUILT:
        assert as_built["core"].startswith("compiled")
    # the traffic is the hard path: hundreds of requests in flight, priced, idle between
    records = as_built["records"]
    assert len(records) >= 900
    assert sum(1 for r in records if r["cost_dollars"] > 0) >= 0.9 * len(records)
    assert as_built["idle"]
    for part in ("records", "idle", "exposition"):
        assert json.dumps(as_built[part], sort_keys=True) == json.dumps(plain[part],
                                                                        sort_keys=True), part
