"""Start tokenpath commands as real subprocesses on free loopback ports."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

# Ports a test hands to a process it starts come from below the kernel's ephemeral range:
# a port bind(0) returns is an ephemeral one, which any outgoing connection on the machine
# may take before the process listens on it ("Address already in use", seen once in CI).
LISTEN_PORT_FLOOR = 20_000
_PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_floor() -> int:
    try:
        return int(_PORT_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


_random_ports = random.Random()


def free_port() -> int:
    """A loopback port nobody listens on, outside the ephemeral range when there is room."""
    ceiling = _ephemeral_floor()
    for _ in range(64):
        port = _random_ports.randrange(LISTEN_PORT_FLOOR, max(LISTEN_PORT_FLOOR + 1, ceiling))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # no room below the range: the kernel's pick
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tokenpath_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "tokenpath.cli.main", *args]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(tokenpath_cmd(*args), capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})}, check=False)


def run_cli_json(*args: str, env: dict[str, str] | None = None) -> Any:
    done = run_cli(*args, "--format", "json", env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def stop_process(process: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout``."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_http(url: str, timeout: float = 30.0,
              process: subprocess.Popen[bytes] | None = None) -> None:
    """Until ``url`` answers 200 (any status under 500 with ``process``, a server that
    may answer its root with 404); fails early when ``process`` has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        try:
            status = httpx.get(url, timeout=1.0).status_code
            if status == 200 or (process is not None and status < 500):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not up after {timeout} s")


def counter_sum(metrics_text: str, name: str) -> float:
    """A Prometheus exposition's samples of ``name``, summed over their labels."""
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


@dataclass
class CollectorProcess:
    proc: subprocess.Popen[str]
    http_port: int
    grpc_port: int
    store: Path

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_endpoint(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def stop(self, sig: int = signal.SIGTERM) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        out = self.proc.stdout.read() if self.proc.stdout else ""
        return out


# Tests send from one process and flush explicitly: no need to wait the production grace
# period (sized for other processes' batch delays) or the attributor's arrival-lag hold.
FAST_CONFIG = """\
assembler:
  root_grace_seconds: 0.3
cost:
  min_delay_seconds: 0.3
  max_delay_seconds: 2.0
  tick_seconds: 0.1
"""


def start_collector(store: Path, *extra: str, env: dict[str, str] | None = None,
                    http_port: int | None = None, grpc_port: int | None = None,
                    command: list[str] | None = None) -> CollectorProcess:
    """``tokenpath collector`` on free loopback ports, up once /healthz answers;
    ``command`` is the tokenpath executable to run (default: this checkout's, through
    this interpreter)."""
    http_port = http_port or free_port()
    grpc_port = grpc_port or free_port()
    if "--config" not in extra:
        config = store.parent / "fast-collector.yaml"
        config.write_text(FAST_CONFIG)
        extra = (*extra, "--config", str(config))
    args = ("collector", "--http", f"127.0.0.1:{http_port}", "--grpc", f"127.0.0.1:{grpc_port}",
            "--store", str(store), *extra)
    proc = subprocess.Popen(
        [*command, *args] if command is not None else tokenpath_cmd(*args),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, **(env or {})},
    )
    collector = CollectorProcess(proc, http_port, grpc_port, store)
    try:
        wait_http(f"{collector.http_url}/healthz")
    except TimeoutError:
        output = collector.stop(signal.SIGKILL)
        raise RuntimeError(f"collector did not start:\n{output}") from None
    return collector


@contextlib.contextmanager
def collector_process(store: Path, *extra: str, **kwargs: Any) -> Iterator[CollectorProcess]:
    collector = start_collector(store, *extra, **kwargs)
    try:
        yield collector
    finally:
        collector.stop()


def poll_records(url: str, expected: int, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Wait until the collector's API lists ``expected`` records."""
    deadline = time.monotonic() + timeout
    records: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        records = httpx.get(f"{url}/api/requests", params={"limit": 10_000}, timeout=5).json()
        if len(records) >= expected:
            return records
        time.sleep(0.2)
    raise AssertionError(f"expected {expected} records, got {len(records)}")
