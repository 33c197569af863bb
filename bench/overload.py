"""RSS under overload: the collector sheds with 429 instead of growing.

The collector runs as a subprocess with a buffer cap and a grace period long enough that
nothing drains; senders push as fast as they can (well over what it keeps), for a fixed
time. RSS is sampled throughout: once the buffer is full, RSS must stay flat while the
excess is answered 429 with Retry-After.
"""

from __future__ import annotations

import json
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.ingest import _free_port
from bench.payloads import SPANS_PER_REQUEST, make_requests

MAX_BUFFERED_SPANS = 100_000


def run(seconds: float = 20.0, senders: int = 3) -> dict[str, Any]:
    import subprocess
    import sys

    # More unique spans than the buffer holds: repeats would only be dropped as duplicates.
    payloads = make_requests(MAX_BUFFERED_SPANS // SPANS_PER_REQUEST * 3 // 2, seed=9)
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "collector.yaml"
        config.write_text(
            f"max_buffered_spans: {MAX_BUFFERED_SPANS}\n"
            "assembler:\n  root_grace_seconds: 3600\n  idle_timeout_seconds: 3600\n"
            "  max_traces: 1000000\n")
        port = _free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "tokenpath.cli.main", "collector", "--http",
             f"127.0.0.1:{port}", "--grpc", "off", "--store", str(Path(tmp) / "s.db"),
             "--config", str(config), "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    httpx.get(f"{url}/healthz", timeout=1)
                    break
                except httpx.HTTPError:
                    time.sleep(0.1)
            ps = psutil.Process(proc.pid)
            counts = {"200": 0, "429": 0, "other": 0}
            lock = threading.Lock()
            stop = time.monotonic() + seconds
            retry_after_seen = []

            def send(offset: int) -> None:
                i = offset
                with httpx.Client(timeout=30) as client:
                    while time.monotonic() < stop:
                        body = payloads[i % len(payloads)]
                        i += senders
                        r = client.post(f"{url}/v1/traces", content=body,
                                        headers={"Content-Type": "application/x-protobuf"})
                        key = str(r.status_code) if r.status_code in (200, 429) else "other"
                        with lock:
                            counts[key] += 1
                            if r.status_code == 429:
                                retry_after_seen.append(r.headers.get("retry-after"))

            threads = [threading.Thread(target=send, args=(k,)) for k in range(senders)]
            for t in threads:
                t.start()
            samples = []
            while any(t.is_alive() for t in threads):
                samples.append((time.monotonic(), ps.memory_info().rss))
                time.sleep(0.5)
            for t in threads:
                t.join()
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    full_at = next((i for i, _ in enumerate(samples) if i and counts["429"]), 0)
    half = samples[len(samples) // 2][1]
    end = samples[-1][1]
    peak = max(rss for _, rss in samples)
    return {
        "seconds": seconds,
        "accepted_requests": counts["200"],
        "accepted_spans": counts["200"] * SPANS_PER_REQUEST,
        "shed_429": counts["429"],
        "other_status": counts["other"],
        "retry_after": retry_after_seen[0] if retry_after_seen else None,
        "rss_mib_mid": half / 2**20,
        "rss_mib_end": end / 2**20,
        "rss_mib_peak": peak / 2**20,
        "rss_growth_ratio": end / half if half else None,
        "samples": len(samples),
        "first_full_sample": full_at,
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
