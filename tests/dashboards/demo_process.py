"""`tokenpath demo` as a subprocess for the live Prometheus test: the reference serving path
(simulated engine, time-scaled), its in-process collector and node agent on given loopback
ports, and the chat workload with a chosen shared-prefix share."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

READY_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 60.0
# The demo ends by itself after this long even if a test forgets it.
MAX_DURATION_SECONDS = 300
TIME_SCALE = 0.02  # the simulated engine 50x faster than the modeled hardware
REQUESTS_PER_SECOND = 8.0
AUTH_TOKEN_ENV = "TOKENPATH_AUTH_TOKEN"  # unset: /metrics open, as Prometheus scrapes it


@dataclass(frozen=True, slots=True)
class DemoPorts:
    collector: int
    agent: int

    @property
    def collector_url(self) -> str:
        return f"http://127.0.0.1:{self.collector}"

    @property
    def agent_url(self) -> str:
        return f"http://127.0.0.1:{self.agent}"


class DemoProcess:
    """One `tokenpath demo` run; :meth:`stop` interrupts it like Ctrl-C (it prints its
    report and exits 0)."""

    def __init__(self, workdir: Path, name: str, ports: DemoPorts, store: Path,
                 shared_prefix: float, seed: int, extra_args: tuple[str, ...] = ()) -> None:
        """``extra_args``: more demo options (a later option wins over an earlier one)."""
        self.ports = ports
        self.log = workdir / f"{name}.log"
        self.argv = [
            sys.executable, "-m", "tokenpath.cli.main", "demo",
            "--duration", str(MAX_DURATION_SECONDS), "--rps", str(REQUESTS_PER_SECOND),
            "--time-scale", str(TIME_SCALE), "--shared-prefix", str(shared_prefix),
            "--seed", str(seed), "--store", str(store),
            "--collector-http", f"127.0.0.1:{ports.collector}",
            "--agent-listen", f"127.0.0.1:{ports.agent}", *extra_args,
        ]
        self.process: subprocess.Popen[bytes] | None = None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != AUTH_TOKEN_ENV}
        env["PYTHONUNBUFFERED"] = "1"  # the log shows how far it got, even if it is killed
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                            env=env)
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        pending = {f"{self.ports.collector_url}/metrics", f"{self.ports.agent_url}/metrics"}
        while pending:
            if self.process.poll() is not None:
                raise AssertionError(f"demo exited early:\n{self.output()[-4000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"demo not ready ({sorted(pending)}):\n"
                                     f"{self.output()[-4000:]}")
            for url in sorted(pending):
                try:
                    with urllib.request.urlopen(url, timeout=1):
                        pending.discard(url)
                except OSError:
                    pass
            if pending:
                time.sleep(0.2)

    def stop(self) -> int | None:
        """Interrupt (SIGINT, as Ctrl-C) and wait; the exit status, None if never started."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        return self.process.returncode
