"""The shims' tests on the ends of the supported OpenTelemetry range, each in a subprocess:

- on the oldest supported packages (opentelemetry-api/sdk/exporters/proto 1.30.0, the
  contrib instrumentations 0.51b0), in the venv of scripts/otel_oldest_env.sh (made once
  and cached; about 40 s the first time);
- on the project's venv (the newest) with ``TOKENPATH_SDK_FAST_PATHS=off``: every private
  fast path replaced by its public path, as on a version outside the tested range.

The project's venv runs them with the fast paths on in the ordinary test run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tokenpath.instrumentation import sdk_compat

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
# The shims' test files: gateway, stage recorder, attribute writes, exporter, the check
# of private SDK use.
SHIM_TESTS = (
    "tests/instrumentation/test_gateway_shim.py",
    "tests/instrumentation/test_gateway_export.py",
    "tests/instrumentation/test_gateway_lifetime.py",
    "tests/instrumentation/test_stage_recorder.py",
    "tests/instrumentation/test_span_attributes.py",
    "tests/instrumentation/test_otlp_exporter.py",
    "tests/instrumentation/test_sdk_private_use.py",
)
OLDEST = ".".join(map(str, sdk_compat.TESTED_MIN))


def _clean_env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if key not in (sdk_compat.SWITCH_ENV, "PYTEST_ADDOPTS", "PYTHONPATH")}
    return env | extra


def _run_shim_tests(python: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [python, "-m", "pytest", *SHIM_TESTS, "-q", "-p", "no:cacheprovider", "-x"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert " passed" in output and " failed" not in output, output[-3000:]
    return output


def test_the_shims_tests_pass_on_the_oldest_supported_opentelemetry() -> None:
    made = subprocess.run(
        ["bash", str(REPO / "scripts" / "otel_oldest_env.sh")], capture_output=True,
        text=True, timeout=600,
        env=_clean_env(TOKENPATH_OTEL_OLDEST_PYTHON=getattr(sys, "_base_executable",
                                                            sys.executable)))
    assert made.returncode == 0, made.stderr[-4000:]
    python = made.stdout.strip().splitlines()[-1]
    versions = subprocess.run(
        [python, "-c", "from importlib.metadata import version as v; "
                       "from tokenpath.instrumentation import sdk_compat as c; "
                       "print(v('opentelemetry-sdk'), v('opentelemetry-api'), "
                       "v('opentelemetry-exporter-otlp-proto-http'), c.SDK_IN_TESTED_RANGE)"],
        cwd=REPO, env=_clean_env(), capture_output=True, text=True, timeout=120, check=True)
    assert versions.stdout.split() == [OLDEST, OLDEST, OLDEST, "True"]
    _run_shim_tests(python, _clean_env())


def test_the_shims_tests_pass_with_every_fast_path_on_the_public_api() -> None:
    env = _clean_env(**{sdk_compat.SWITCH_ENV: "off"})
    check = subprocess.run(
        [sys.executable, "-c", "from tokenpath.instrumentation import sdk_compat as c; "
                               "print(c.SDK_IN_TESTED_RANGE, c.EXPORTER_IN_TESTED_RANGE)"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=True)
    assert check.stdout.split() == ["False", "False"]
    _run_shim_tests(sys.executable, env)
