"""Real Prometheus and Alertmanager (Debian packages) started on free loopback ports, and a
tiny webhook receiver, for the live dashboards and alert tests."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from testkit.support.loopback_http import LoopbackHTTPServer, QuietHandler
from testkit.support.processes import free_port

PROMETHEUS_BINARIES = ("prometheus",)
ALERTMANAGER_BINARIES = ("prometheus-alertmanager", "alertmanager")
READY_TIMEOUT_SECONDS = 30.0


def find_binary(names: tuple[str, ...]) -> str | None:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None




def http_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def _wait_ready(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url} exited early:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} not ready:\n{log.read_text(errors='replace')[-3000:]}")


class ManagedProcess:
    """A subprocess with its log file; stop() ends only this process."""

    def __init__(self, argv: list[str], log: Path, ready_url: str) -> None:
        self.argv = argv
        self.log = log
        self.ready_url = ready_url
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT)
        _wait_ready(self.ready_url, self.process, self.log)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


def start_alertmanager(binary: str, workdir: Path, webhook_url: str) -> tuple[ManagedProcess, str]:
    port = free_port()
    config = {
        "route": {"receiver": "test-webhook", "group_by": ["alertname"], "group_wait": "1s",
                  "group_interval": "1s", "repeat_interval": "1h"},
        "receivers": [{"name": "test-webhook",
                       "webhook_configs": [{"url": webhook_url, "send_resolved": False}]}],
    }
    path = workdir / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    (workdir / "am-data").mkdir()
    url = f"http://127.0.0.1:{port}"
    process = ManagedProcess(
        [binary, f"--config.file={path}", f"--storage.path={workdir / 'am-data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
        workdir / "alertmanager.log", f"{url}/-/ready")
    process.start()
    return process, url


def start_prometheus(binary: str, workdir: Path, scrape_jobs: dict[str, list[str]],
                     rule_file: Path, alertmanager_url: str, interval: str = "1s",
                     target_labels: dict[str, dict[str, str]] | None = None,
                     ) -> tuple[ManagedProcess, str]:
    """Static scrape jobs (job -> targets), ``target_labels`` per job as in deploy/."""
    port = free_port()
    labels = target_labels or {}
    am_host = urllib.parse.urlparse(alertmanager_url).netloc
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(rule_file)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [am_host]}]}]},
        "scrape_configs": [
            {"job_name": job,
             "static_configs": [{"targets": targets, **({"labels": labels[job]}
                                                        if job in labels else {})}]}
            for job, targets in scrape_jobs.items()],
    }
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    url = f"http://127.0.0.1:{port}"
    process = ManagedProcess(
        [binary, f"--config.file={path}", f"--storage.tsdb.path={workdir / 'prom-data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        workdir / "prometheus.log", f"{url}/-/ready")
    process.start()
    return process, url


def instant_query(prometheus_url: str, expr: str) -> dict[str, Any]:
    query = urllib.parse.urlencode({"query": expr})
    try:
        result: dict[str, Any] = http_json(f"{prometheus_url}/api/v1/query?{query}")
    except urllib.error.HTTPError as exc:
        return {"status": "error", "error": exc.read().decode(errors="replace")}
    return result


def values(prometheus_url: str, expr: str) -> list[dict[str, Any]]:
    """An instant query's result vector; the query must succeed."""
    reply = instant_query(prometheus_url, expr)
    assert reply.get("status") == "success", (expr, reply)
    result: list[dict[str, Any]] = reply["data"]["result"]
    return result


POLL_SECONDS = 0.5


def poll(what: str, timeout: float, check: Callable[[], bool],
         detail: Callable[[], str] = lambda: "") -> None:
    """Wait until ``check()`` holds (a hang, not a speed check: ``timeout`` is generous);
    the error names ``what`` and ``detail()``."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}. "
                                 f"{detail()}")
        time.sleep(POLL_SECONDS)


class WebhookReceiver:
    """Collects Alertmanager webhook notifications (JSON bodies) on loopback."""

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._lock:
                    receiver.notifications.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

        self._server = LoopbackHTTPServer(Handler, start=False)

    @property
    def url(self) -> str:
        return f"{self._server.base_url}/alerts"

    def start(self) -> None:
        self._server.start()

    def shutdown(self) -> None:
        self._server.shutdown()

    def alerts(self) -> list[dict[str, Any]]:
        with self._lock:
            return [alert for n in self.notifications for alert in n.get("alerts", [])]
