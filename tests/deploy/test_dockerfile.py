"""deploy/Dockerfile: no container engine can pull base images here, so the Dockerfile is
read (its stages and what each holds) and its build steps are run as written, in virtual
environments standing for the two stages' Pythons.

What running the steps here does not cover: the base image itself (python:3.11-slim) and
the apt-get line (this machine's compiler stands in for the build stage's gcc).
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import venv
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "Dockerfile"


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, keyword: str) -> list[str]:
        return [rest for word, rest in self.instructions if word == keyword]


def read_stages(text: str) -> list[Stage]:
    stages: list[Stage] = []
    for raw in text.replace("\\\n", " ").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word.upper() == "FROM":
            base, _, name = rest.partition(" AS ")
            stages.append(Stage(base.strip(), name.strip() or None))
        else:
            assert stages, f"{line!r} before any FROM"
            stages[-1].instructions.append((word.upper(), rest.strip()))
    return stages


def _namespace_folders() -> list[str]:
    tree = ast.parse((REPO / "setup.py").read_text())
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "NAMESPACE_ROOTS"):
            mapping = ast.literal_eval(node.value)
            assert isinstance(mapping, dict)
            return sorted(str(folder) for folder in mapping.values())
    raise AssertionError("setup.py has no NAMESPACE_ROOTS")


def _copied_sources(stage: Stage) -> list[str]:
    sources: list[str] = []
    for rest in stage.args("COPY"):
        parts = [p for p in rest.split() if not p.startswith("--")]
        sources.extend(parts[:-1])
    return sources


STAGES = read_stages(DOCKERFILE.read_text())


def test_a_compiler_in_the_build_stage_and_none_in_the_runtime() -> None:
    assert len(STAGES) == 2
    build, runtime = STAGES
    assert build.name == "build" and build.base == runtime.base == "python:3.11-slim"
    assert any("apt-get install" in run and " gcc " in f" {run} " for run in build.args("RUN"))
    assert not any("apt-get" in run or "gcc" in run for run in runtime.args("RUN"))
    assert any(rest.startswith("--from=build ") for rest in runtime.args("COPY"))
    assert not [s for s in _copied_sources(runtime) if not s.startswith("/")]  # no sources
    assert runtime.args("USER") == ["10001"]


def test_the_build_stage_copies_everything_the_package_build_reads() -> None:
    (build, _) = STAGES
    copied = _copied_sources(build)
    for needed in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md",
                   *_namespace_folders()):
        assert needed in copied, f"deploy/Dockerfile does not copy {needed}"
    for source in copied:
        assert (REPO / source).exists(), source


def test_the_image_refuses_to_finish_without_the_compiled_core_and_native_decoder() -> None:
    (_, runtime) = STAGES
    checks = [run for run in runtime.args("RUN") if run.startswith("tokenpath --version")]
    assert checks == ['tokenpath --version | grep "core: compiled, decoder: native"']


def _env_lines(stage: Stage) -> dict[str, str]:
    values: dict[str, str] = {}
    for rest in [*stage.args("ARG"), *stage.args("ENV")]:
        key, _, value = rest.partition("=")
        values[key] = value
    return values


def _run_steps(stage: Stage, python_root: Path, cwd: Path, remap: dict[str, Path],
               skip: tuple[str, ...]) -> list[str]:
    """Runs the stage's RUN lines with ``python_root``'s Python first on the PATH and every
    absolute path of the stage's ARG/ENV moved under the test's folder (``remap``)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{python_root / 'bin'}{os.pathsep}{env['PATH']}"
    for key, value in _env_lines(stage).items():
        env[key] = str(remap.get(value, value))
    outputs = []
    for run in stage.args("RUN"):
        if run.startswith(skip):
            continue
        # pip's cache: the image keeps none (--no-cache-dir); here it may serve the downloads
        command = run.replace(" --no-cache-dir", "")
        done = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=1200, check=False)
        assert done.returncode == 0, f"{run}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        outputs.append(done.stdout)
    return outputs


@pytest.mark.integration
@pytest.mark.timeout(1500)  # the build stage compiles the core; pip's steps time out at 1200
def test_the_build_steps_run_and_the_installed_image_runs_compiled(tmp_path: Path) -> None:
    build, runtime = STAGES
    source = tmp_path / "src"
    for name in _copied_sources(build):
        origin = REPO / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=shutil.ignore_patterns(
                "__pycache__", "*.so", "*.pyc"))
        else:
            source.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, source / name)
    remap = {"/wheels": tmp_path / "wheels", "/var/cache/tokenpath": tmp_path / "cache"}
    for root in ("build-python", "runtime-python"):
        venv.EnvBuilder(with_pip=True).create(tmp_path / root)
    _run_steps(build, tmp_path / "build-python", source, remap, skip=("apt-get",))
    assert list((tmp_path / "wheels").glob("tokenpath-*-cp3*-*.whl"))
    # the runtime stage: what COPY --from=build brings, then its steps (not the user's)
    assert any(re.match(r"--from=build /wheels /wheels$", c) for c in runtime.args("COPY"))
    outputs = _run_steps(runtime, tmp_path / "runtime-python", tmp_path, remap,
                         skip=("useradd",))
    assert "core: compiled, decoder: native" in outputs[-1]
    assert not (tmp_path / "wheels").exists()  # removed after the install, as in the image
    verdicts = list((tmp_path / "cache").glob("install-check-*.json"))
    assert len(verdicts) == 2  # kept in the image: no container start checks again
