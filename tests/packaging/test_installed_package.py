"""The package as users get it: the sdist and the wheel built in isolated environments
(``python -m build``), the wheel installed in a fresh virtual environment, its
``tokenpath collector`` and ``tokenpath agent`` run on vLLM-shaped traffic.

Three installs of one sdist:

- built with a C compiler: the compiled core and the native decoder, and
  ``tokenpath_build_info`` says so;
- built with ``CC`` set to a program that fails: plain Python, and the same traffic gives
  the same records;
- the first install with both extensions replaced by ones that crash the process on
  import (a wrong build): the install check's child crashes, the collector runs Python,
  says why in ``tokenpath_build_fallbacks_total`` and prices the same records.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import time
import venv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit.support.otlp import sample
from testkit.support.processes import (
    free_port,
    poll_records,
    start_collector,
    stop_process,
)
from tokenpath import metric_names as M
from tokenpath.install_check import CACHE_DIR_ENV, LIBRARY_GROUP
from tokenpath.sample_traffic import sample_export

# Each build compiles the core (about 2 minutes of one core); on a shared machine, longer.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
REQUESTS = 8
BUILD_TIMEOUT = 900
# Every record of the sample is in before its engine's slices close (the sample's spans
# end up to 5 s before they are sent), so each run prices the sample as live traffic and
# two runs agree to the last digit.
COLLECTOR_CONFIG = """\
assembler:
  root_grace_seconds: 0.3
cost:
  min_delay_seconds: 10
  max_delay_seconds: 20
  tick_seconds: 0.1
"""


def _run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, capture_output=True, text=True, timeout=BUILD_TIMEOUT,
                          check=False, **kwargs)
    assert done.returncode == 0, f"{args}: {done.returncode}\n{done.stdout[-3000:]}\n" \
                                 f"{done.stderr[-3000:]}"
    return done


def _checkout_copy(folder: Path) -> Path:
    """What the repository holds (tracked and untracked-but-not-ignored files): no build
    output of this checkout leaks into the build."""
    listed = _run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO).stdout
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            target = folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return folder


@dataclass
class Install:
    root: Path
    cache: Path

    @property
    def tokenpath(self) -> list[str]:
        return [str(self.root / "bin" / "tokenpath")]

    @property
    def env(self) -> dict[str, str]:
        # the install's own verdict cache; nothing of this checkout on the path
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "TOKENPATH_PURE_PYTHON", "TOKENPATH_OTLP_DECODER")}
        env[CACHE_DIR_ENV] = str(self.cache)
        return env

    def site_packages(self) -> Path:
        found = list((self.root / "lib").glob("python3*/site-packages"))
        assert len(found) == 1, found
        return found[0]


def _install(wheel: Path, root: Path) -> Install:
    venv.EnvBuilder(with_pip=True, clear=True).create(root)
    _run([str(root / "bin" / "python"), "-m", "pip", "install", "-q",
          "--disable-pip-version-check", str(wheel)])
    return Install(root, root.parent / f"{root.name}-cache")


@dataclass
class Dist:
    sdist: Path
    wheel: Path


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """``python -m build``: the sdist, then the wheel from the sdist, each in an isolated
    environment with only the build requirements."""
    work = tmp_path_factory.mktemp("build")
    source = _checkout_copy(work / "source")
    out = work / "dist"
    _run([sys.executable, "-m", "build", "--outdir", str(out), str(source)], cwd=work)
    (sdist,) = out.glob("tokenpath-*.tar.gz")
    (wheel,) = out.glob("tokenpath-*.whl")
    return Dist(sdist, wheel)


@pytest.fixture(scope="module")
def compiled_install(dist: Dist, tmp_path_factory: pytest.TempPathFactory) -> Install:
    assert not dist.wheel.name.endswith("-none-any.whl"), "built without its extensions"
    return _install(dist.wheel, tmp_path_factory.mktemp("compiled") / "venv")


@pytest.fixture(scope="module")
def python_install(dist: Dist, tmp_path_factory: pytest.TempPathFactory) -> Install:
    """The same sdist built where the C compiler fails."""
    work = tmp_path_factory.mktemp("no-compiler")
    failing = work / "failing-cc"
    failing.write_text("#!/bin/sh\necho 'this compiler always fails' >&2\nexit 1\n")
    failing.chmod(0o755)
    env = {**os.environ, "CC": str(failing)}
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check",
          "--no-deps", "--no-cache-dir", "-w", str(work / "dist"), str(dist.sdist)],
         cwd=work, env=env)
    (wheel,) = (work / "dist").glob("tokenpath-*.whl")
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    return _install(wheel, work / "venv")


def _build_labels(metrics_text: str) -> dict[str, str]:
    for line in metrics_text.splitlines():
        if line.startswith(M.BUILD_INFO.name + "{"):
            pairs = line[line.index("{") + 1:line.index("}")].split(",")
            return {k: v.strip('"') for k, v in (pair.split("=", 1) for pair in pairs)}
    raise AssertionError(f"no {M.BUILD_INFO.name} in /metrics")


@dataclass
class Observed:
    version_line: str
    collector_build: dict[str, str]
    collector_metrics: str
    records: dict[str, dict[str, Any]]


def _send_and_collect(install: Install, folder: Path) -> Observed:
    """Runs the install's collector, sends the sample (a gateway span and vLLM's
    ``llm_request`` per request), waits for every record to be priced."""
    folder.mkdir(parents=True, exist_ok=True)
    version = _run([*install.tokenpath, "--version"], env=install.env).stdout.strip()
    config = folder / "collector.yaml"
    config.write_text(COLLECTOR_CONFIG)
    collector = start_collector(folder / "store.db", "--config", str(config), env=install.env,
                                command=install.tokenpath)
    try:
        body = sample_export(time.time(), requests=REQUESTS).SerializeToString()
        answer = httpx.post(f"{collector.http_url}/v1/traces", content=body, timeout=30,
                            headers={"Content-Type": "application/x-protobuf"})
        assert answer.status_code == 200, answer.text
        listed = poll_records(collector.http_url, REQUESTS, timeout=120)
        metrics = httpx.get(f"{collector.http_url}/metrics", timeout=30).text
    finally:
        output = collector.stop()
    assert "Traceback" not in output, output
    return Observed(version, _build_labels(metrics), metrics,
                    {record["trace_id"]: record for record in listed})


def _agent_build(install: Install) -> dict[str, str]:
    port = free_port()
    agent = subprocess.Popen([*install.tokenpath, "agent", "--listen", f"127.0.0.1:{port}"],
                             env=install.env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert agent.poll() is None, agent.stdout.read() if agent.stdout else ""
            try:
                answer = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
                if answer.status_code == 200:
                    return _build_labels(answer.text)
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the agent's /metrics never answered"
            time.sleep(0.2)
    finally:
        stop_process(agent)  # type: ignore[arg-type]


def _same_records(got: dict[str, dict[str, Any]], want: dict[str, dict[str, Any]]) -> None:
    assert got.keys() == want.keys()
    for trace_id, record in got.items():
        expected = want[trace_id]
        for key in ("model", "input_tokens", "output_tokens", "cache_read_tokens", "complete"):
            assert record[key] == expected[key], (trace_id, key)
        assert record["cost_dollars"] > 0
        assert record["cost_dollars"] == pytest.approx(expected["cost_dollars"], rel=1e-9)
        assert record["stages"].keys() == expected["stages"].keys()
        for stage, timing in record["stages"].items():
            assert timing["seconds"] == pytest.approx(expected["stages"][stage]["seconds"],
                                                      rel=1e-9, abs=1e-12), stage


@pytest.fixture(scope="module")
def compiled_run(compiled_install: Install, tmp_path_factory: pytest.TempPathFactory
                 ) -> Observed:
    return _send_and_collect(compiled_install, tmp_path_factory.mktemp("compiled-run"))


def test_the_built_wheel_runs_the_compiled_core_and_the_native_decoder(
        compiled_install: Install, compiled_run: Observed) -> None:
    assert compiled_run.version_line.endswith("(core: compiled, decoder: native)")
    assert compiled_run.collector_build == {
        M.LABEL_VERSION: compiled_run.collector_build[M.LABEL_VERSION],
        M.LABEL_CORE: "compiled", M.LABEL_DECODER: "native"}
    assert len(compiled_run.records) == REQUESTS
    for record in compiled_run.records.values():
        assert record["cost_dollars"] > 0 and record["complete"]
    assert _agent_build(compiled_install)[M.LABEL_CORE] == "compiled"


def test_a_build_without_a_compiler_installs_and_prices_the_same(
        python_install: Install, compiled_run: Observed, tmp_path: Path) -> None:
    observed = _send_and_collect(python_install, tmp_path)
    assert observed.version_line.endswith("(core: python, decoder: python)")
    assert observed.collector_build[M.LABEL_CORE] == "python"
    assert observed.collector_build[M.LABEL_DECODER] == "python"
    for component in ("core", "decoder"):
        assert sample(observed.collector_metrics, M.BUILD_FALLBACKS.series,
                      component=component, reason="not_built") == 1
    _same_records(observed.records, compiled_run.records)
    assert _agent_build(python_install) == observed.collector_build


_CRASHING_EXTENSION = """
#include <Python.h>
#include <signal.h>
PyMODINIT_FUNC PyInit_{name}(void) {{ raise(SIGSEGV); return NULL; }}
"""


def _replace_with_crasher(extension: Path, work: Path) -> None:
    name = extension.name.split(".")[0]
    source = work / f"{name}.c"
    source.write_text(_CRASHING_EXTENSION.format(name=name))
    _run([os.environ.get("CC", "cc"), "-shared", "-fPIC",
          f"-I{sysconfig.get_paths()['include']}", str(source), "-o", str(extension)])


def test_a_crashing_build_is_checked_and_runs_python(
        compiled_install: Install, compiled_run: Observed, tmp_path: Path) -> None:
    # Runs last: it breaks the compiled install for good.
    site = compiled_install.site_packages()
    (core,) = site.glob(LIBRARY_GROUP.replace(".", "/") + "__mypyc.*.so")
    (decoder,) = (site / "tokenpath/collector/receivers").glob("_otlp_native.*.so")
    for extension in (core, decoder):
        _replace_with_crasher(extension, tmp_path)
    crashed = subprocess.run([str(compiled_install.root / "bin" / "python"), "-P", "-c",
                              "import tokenpath.collector.receivers._otlp_native"],
                             capture_output=True, check=False, timeout=60)
    assert crashed.returncode == -11  # the stub does crash a process that imports it
    observed = _send_and_collect(compiled_install, tmp_path / "run")
    assert observed.version_line.endswith("(core: python, decoder: python)")
    for component in ("core", "decoder"):
        assert sample(observed.collector_metrics, M.BUILD_FALLBACKS.series,
                      component=component, reason="self_check_failed") == 1
    _same_records(observed.records, compiled_run.records)
