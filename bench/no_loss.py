"""Nothing accepted is lost: N vLLM-shaped requests (an ASGI gateway span with vLLM's
``llm_request`` child; tokenpath/sample_traffic.py) sent over OTLP/HTTP by a few clients
as fast as a collector process (its default configuration) accepts them, each client
honouring 429 + Retry-After. Reports what was accepted, refused and stored, and the
records dropped (target 0: every accepted request stored).

    python -m bench.no_loss [REQUESTS]
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tokenpath import metric_names as M
from tokenpath.sample_traffic import sample_export

PER_EXPORT = 50  # gateway + vLLM span pairs per export request
CLIENTS = 4
PROTOBUF = {"Content-Type": "application/x-protobuf"}


class RetryingClient(threading.Thread):
    """Sends its share of export requests; on 429 waits Retry-After and sends again."""

    def __init__(self, url: str, index: int, exports: int, per_export: int = PER_EXPORT
                 ) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.index = index
        self.exports = exports
        self.per_export = per_export
        self.accepted = 0
        self.refused = 0
        self.error: str | None = None

    def run(self) -> None:
        try:
            with httpx.Client(timeout=60) as client:
                for n in range(self.exports):
                    seed = self.index * 1_000_000 + n
                    body = sample_export(time.time(), self.per_export, seed).SerializeToString()
                    while True:
                        response = client.post(f"{self.url}/v1/traces", content=body,
                                               headers=PROTOBUF)
                        if response.status_code != 429:
                            break
                        self.refused += 1
                        time.sleep(float(response.headers["retry-after"]))
                    if response.status_code != 200:
                        raise RuntimeError(f"{response.status_code}: {response.text[:200]}")
                    self.accepted += self.per_export
        except BaseException as exc:  # reported by the caller
            self.error = repr(exc)


def clients_for(url: str, requests: int, clients: int = CLIENTS,
                per_export: int = PER_EXPORT) -> list[RetryingClient]:
    exports = requests // per_export
    return [RetryingClient(url, i, exports // clients + (i < exports % clients), per_export)
            for i in range(clients)]


def stored_records(store: Path) -> int:
    try:
        with closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=5)) as db:
            (n,) = db.execute("SELECT COUNT(*) FROM records").fetchone()
    except sqlite3.Error:
        return 0  # not created yet, or busy for a moment
    return int(n)


def counter_total(metrics_text: str, series: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == series:
                total += sample.value
    return total


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(requests: int = 300_000) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tokenpath-no-loss-") as tmp:
        store = Path(tmp) / "store.db"
        port = _free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "tokenpath.cli.main", "collector", "--http",
             f"127.0.0.1:{port}", "--grpc", "off", "--store", str(store)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ))
        url = f"http://127.0.0.1:{port}"
        try:
            while True:
                try:
                    if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
                if proc.poll() is not None:
                    raise RuntimeError("the collector exited at start")
            started = time.monotonic()
            clients = clients_for(url, requests)
            for client in clients:
                client.start()
            for client in clients:
                client.join()
            errors = [c.error for c in clients if c.error]
            if errors:
                raise RuntimeError(errors[0])
            sent_seconds = time.monotonic() - started
            accepted = sum(c.accepted for c in clients)
            while True:  # every accepted record stored or counted as dropped
                metrics = httpx.get(f"{url}/metrics", timeout=30).text
                dropped = counter_total(metrics, M.RECORDS_DROPPED.series)
                if stored_records(store) + dropped >= accepted:
                    break
                time.sleep(0.5)
            stored_seconds = time.monotonic() - started
        finally:
            proc.terminate()
            proc.wait(timeout=120)
        return {
            "requests": requests, "accepted": accepted, "stored": stored_records(store),
            "dropped": dropped, "refused_429": sum(c.refused for c in clients),
            "sent_seconds": round(sent_seconds, 2), "stored_seconds": round(stored_seconds, 2),
            "accepted_per_second": round(accepted / sent_seconds, 1),
        }


if __name__ == "__main__":
    print(json.dumps(run(int(sys.argv[1]) if len(sys.argv) > 1 else 300_000), indent=2))
