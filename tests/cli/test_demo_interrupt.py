"""Ctrl-C stops the demo and prints its report even when it was started with SIGINT
ignored, as a shell starts a background job (``tokenpath demo &``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from testkit.support.processes import free_port
from tokenpath import metric_names as M

READY_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 120.0


def _spans_received(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as answer:
            body = answer.read().decode()
    except OSError:
        return False
    return any(line.startswith(M.SPANS_RECEIVED.series) and not line.endswith(" 0.0")
               for line in body.splitlines())


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_sigint_stops_a_demo_started_with_sigint_ignored(tmp_path: Path) -> None:
    port = free_port()
    argv = [sys.executable, "-m", "tokenpath.cli.main", "demo", "--duration", "600",
            "--rps", "4", "--time-scale", "0.02", "--store", str(tmp_path / "s.db"),
            "--collector-http", f"127.0.0.1:{port}", "--agent-listen",
            f"127.0.0.1:{free_port()}"]
    log = tmp_path / "demo.log"
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                   preexec_fn=_ignore_sigint,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while not _spans_received(port):  # the workload is running
            assert process.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, "the demo's collector never received spans"
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=STOP_TIMEOUT_SECONDS) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = log.read_text(errors="replace")
    assert "interrupted" in output and "This run:" in output
