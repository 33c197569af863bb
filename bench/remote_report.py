"""``tokenpath report --collector`` over running collectors, beside ``--store`` on the same
records: wall seconds and the CLI's peak RSS over one collector holding N records and over
three replicas holding a third each (the collectors are ``tokenpath collector`` processes
on the store files, as a user runs them; the CLI is a fresh interpreter each time).

Since the views are computed on the collectors' aggregates (``GET /api/aggregate``),
neither the CLI's time nor its memory should follow the records: the targets are those of
``--store`` (5 s and 300 MB at 1M records).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.store import run_command, write_store

READY_TIMEOUT_SECONDS = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Collector:
    def __init__(self, store: Path) -> None:
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        self._log = store.with_suffix(".log")
        with self._log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tokenpath.cli.main", "collector", "--grpc", "off",
                 "--http", f"127.0.0.1:{port}", "--store", str(store)],
                stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError(self._log.read_text(errors="replace")[-2000:]) from None
                time.sleep(0.2)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def _report(*source: str) -> list[str]:
    return [sys.executable, "-m", "tokenpath.cli.main", "report", *source, "--since", "24h",
            "--format", "json"]


def run(count: int = 1_000_000) -> dict[str, Any]:
    out: dict[str, Any] = {"records": count}
    with tempfile.TemporaryDirectory(prefix="tokenpath-remote-bench-") as tmp:
        now = time.time()
        whole = Path(tmp) / "whole.db"
        write_store(whole, count, now)
        thirds = [Path(tmp) / f"replica-{i}.db" for i in range(3)]
        for path in thirds:
            write_store(path, count // 3, now)
        out["store"] = run_command(_report("--store", str(whole)))
        alone = _Collector(whole)
        try:
            out["one_collector"] = run_command(_report("--collector", alone.url))
        finally:
            alone.stop()
        replicas = [_Collector(p) for p in thirds]
        try:
            out["three_replicas"] = run_command(
                _report("--collector", ",".join(r.url for r in replicas)))
        finally:
            for replica in replicas:
                replica.stop()
    out["summary"] = {
        "store_seconds": out["store"]["seconds"],
        "collector_seconds": out["one_collector"]["seconds"],
        "collector_peak_rss_mb": out["one_collector"]["peak_rss_mb"],
        "replicas_seconds": out["three_replicas"]["seconds"],
        "replicas_peak_rss_mb": out["three_replicas"]["peak_rss_mb"],
        "records": count,
    }
    return out


if __name__ == "__main__":
    print(json.dumps(run(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000), indent=2))
