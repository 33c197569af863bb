"""A short coverage-guided run of the differential fuzz target (fuzz/otlp_native_fuzz.py):
the compiled trace decoder against protobuf's parser and the reference decoder, on raw
bytes and on structure-aware edits of valid requests. A fixed number of inputs from a
fixed seed, in a subprocess (libFuzzer owns the process it runs in); skipped only where
atheris is not installed (it is in the ``dev`` extra)."""

from __future__ import annotations

import importlib.util
import random
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.collector.test_otlp_native import _compiler
from tokenpath.collector.receivers import otlp_decode

TARGET = Path(__file__).resolve().parents[2] / "fuzz" / "otlp_native_fuzz.py"
RUNS = 20_000
# libFuzzer's -rss_limit_mb reads the process's peak RSS (getrusage), and Linux starts a
# child with its parent's peak (fork or vfork, kept through exec): from a pytest worker
# that had once peaked at 2.4 GB, the target counted 2,448 MB before its first input and
# stopped as out of memory. A small interpreter in between starts it with a count of its
# own, so the limit measures the target.
LAUNCHER = "import subprocess, sys; sys.exit(subprocess.run(sys.argv[1:]).returncode)"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("otlp_native_fuzz", TARGET)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _needs_native() -> None:
    if not otlp_decode.native_decoder_available():
        assert not _compiler(), "a C compiler is here but the native decoder was not built"
        pytest.skip("no C compiler: the collector runs on the pure-Python decoder")


def test_the_target_runs_without_atheris() -> None:
    _needs_native()
    target = _load()
    rng = random.Random(2)
    inputs = [b"", b"\x00", *(b"\x00" + seed for seed in target.seed_requests()),
              *(b"\x01" + rng.randbytes(rng.randint(0, 64)) for _ in range(300)),
              *(rng.randbytes(rng.randint(1, 200)) for _ in range(300))]
    for data in inputs:
        target.test_one_input(data)


def test_a_short_atheris_run_finds_no_difference(tmp_path: Path) -> None:
    pytest.importorskip("atheris")
    _needs_native()
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, seed in enumerate(_load().seed_requests()):
        (corpus / f"raw-{i}").write_bytes(b"\x00" + seed)
        (corpus / f"edited-{i}").write_bytes(bytes([1, i]) + bytes(range(7, 40)))
    done = subprocess.run(
        [sys.executable, "-c", LAUNCHER, sys.executable, str(TARGET), f"-runs={RUNS}",
         "-seed=1", "-timeout=60", "-rss_limit_mb=2048", f"-artifact_prefix={tmp_path}/",
         str(corpus)],
        capture_output=True, text=True, timeout=600, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert f"Done {RUNS} runs" in output, output[-3000:]
