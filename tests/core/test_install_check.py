"""The install check (tokenpath/install_check.py) on this checkout's in-place build: a
built part is trusted once its child check passed, a failed verdict makes the process run
Python with the reason, and the switches say ``disabled``. Each case runs in a fresh
process (the decision is made once per process, before the first compiled import).

The real crash of a wrongly built extension is in tests/packaging (an installed wheel
whose extensions are replaced by ones that crash the process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from testkit.support.otlp import sample
from tokenpath import compiled
from tokenpath import metric_names as M
from tokenpath.build_metrics import BuildInfoCollector
from tokenpath.install_check import (
    CACHE_DIR_ENV,
    CHECK_ENV,
    DECODER_ENV,
    BuildState,
    Fallback,
)

REPO = Path(__file__).resolve().parents[2]
BUILT = os.environ.get(compiled.COMPILE_ENV, "1") != "0"
needs_build = pytest.mark.skipif(not BUILT, reason="TOKENPATH_COMPILE=0: built as plain Python")

_REPORT = """
import json
from tokenpath.install_check import build_state
from tokenpath.compiled import compiled_modules
from tokenpath.collector.receivers.otlp_decode import native_decoder_available
state = build_state()
print(json.dumps({"core": state.core, "decoder": state.decoder,
                  "fallbacks": [[f.component, f.reason, f.detail] for f in state.fallbacks],
                  "compiled": len(compiled_modules()), "native": native_decoder_available()}))
"""


def _report(cache: Path, **env: str) -> dict[str, Any]:
    clean = {k: v for k, v in os.environ.items()
             if k not in (compiled.PURE_PYTHON_ENV, DECODER_ENV, CHECK_ENV)}
    done = subprocess.run([sys.executable, "-c", _REPORT], cwd=REPO, capture_output=True,
                          text=True, timeout=300, check=True,
                          env={**clean, CACHE_DIR_ENV: str(cache), **env})
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _verdicts(cache: Path) -> dict[str, dict[str, Any]]:
    found = {}
    for path in cache.glob("install-check-*.json"):
        verdict = json.loads(path.read_text())
        found[verdict["component"]] = {"path": path, **verdict}
    return found


@needs_build
def test_a_built_install_is_checked_once_and_then_trusted(tmp_path: Path) -> None:
    first = _report(tmp_path)
    assert (first["core"], first["decoder"], first["fallbacks"]) == ("compiled", "native", [])
    assert first["compiled"] == len(compiled.COMPILED_MODULES) and first["native"]
    verdicts = _verdicts(tmp_path)
    assert {c: v["passed"] for c, v in verdicts.items()} == {"core": True, "decoder": True}
    stamps = {c: v["path"].stat().st_mtime_ns for c, v in verdicts.items()}
    assert _report(tmp_path)["core"] == "compiled"
    assert {c: v["path"].stat().st_mtime_ns for c, v in _verdicts(tmp_path).items()} == stamps


@needs_build
def test_a_failed_verdict_runs_python_and_says_why(tmp_path: Path) -> None:
    _report(tmp_path)
    for verdict in _verdicts(tmp_path).values():
        path = verdict.pop("path")
        path.write_text(json.dumps({**verdict, "passed": False,
                                    "detail": "the check process was killed by SIGSEGV"}))
    report = _report(tmp_path)
    assert (report["core"], report["decoder"]) == ("python", "python")
    assert report["compiled"] == 0 and not report["native"]  # the .py source is imported
    assert sorted(report["fallbacks"]) == [
        ["core", "self_check_failed", "the check process was killed by SIGSEGV"],
        ["decoder", "self_check_failed", "the check process was killed by SIGSEGV"]]


def test_the_switches_run_python_as_disabled(tmp_path: Path) -> None:
    report = _report(tmp_path, **{compiled.PURE_PYTHON_ENV: "1", DECODER_ENV: "python"})
    assert (report["core"], report["decoder"]) == ("python", "python")
    assert sorted(f[:2] for f in report["fallbacks"]) == [["core", "disabled"],
                                                         ["decoder", "disabled"]]
    assert not _verdicts(tmp_path)  # nothing to check


@needs_build
def test_the_check_can_be_switched_off(tmp_path: Path) -> None:
    report = _report(tmp_path, **{CHECK_ENV: "0"})
    assert (report["core"], report["decoder"]) == ("compiled", "native")
    assert not _verdicts(tmp_path)


def test_build_info_and_fallbacks_on_a_registry() -> None:
    registry = CollectorRegistry()
    registry.register(BuildInfoCollector(BuildState(
        "1.2.3", "python", "native", (Fallback("core", "self_check_failed", "crashed"),))))
    text = generate_latest(registry).decode()
    assert sample(text, M.BUILD_INFO.name, version="1.2.3", core="python",
                  decoder="native") == 1
    assert sample(text, M.BUILD_FALLBACKS.series, component="core",
                  reason="self_check_failed") == 1
    assert sample(text, M.BUILD_FALLBACKS.series, component="decoder",
                  reason="self_check_failed") == 0
