"""The ingest bench's CPU clock: the scheduler's per-thread nanosecond counts of a real
process, agreeing with psutil's tick count to within its ticks; the tick count where a
thread ended in between (its count left with it)."""

from __future__ import annotations

import subprocess
import sys

import psutil

from bench.ingest import CpuClock, process_cpu_seconds

# A second thread is started and said ready; on "go" it spins about 0.3 s of CPU, then
# ends (``ENDS = True``) or stays alive; "spun" once it is done.
SPINNER = """
import sys, threading, time
ENDS = {ends}
go, done = threading.Event(), threading.Event()
def spin():
    go.wait()
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    done.set()
    if not ENDS:
        threading.Event().wait()
worker = threading.Thread(target=spin, daemon=True)
worker.start()
print("ready", flush=True)
sys.stdin.readline()
go.set()
done.wait()
if ENDS:
    worker.join()
print("spun", flush=True)
sys.stdin.readline()
"""
TICK_SECONDS = 0.01


def _spin(ends: bool) -> tuple[subprocess.Popen[str], CpuClock]:
    child = subprocess.Popen([sys.executable, "-c", SPINNER.format(ends=ends)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    clock = CpuClock(psutil.Process(child.pid))  # both threads alive here
    child.stdin.write("go\n")
    child.stdin.flush()
    assert child.stdout.readline().strip() == "spun"
    return child, clock


def test_the_scheduler_count_agrees_with_the_ticks() -> None:
    child, clock = _spin(ends=False)
    try:
        seconds, precise = clock.seconds()
        ticks = process_cpu_seconds(psutil.Process(child.pid)) - clock._ticks
        assert precise
        assert seconds >= 0.3
        assert abs(seconds - ticks) <= 5 * TICK_SECONDS
    finally:
        child.kill()
        child.wait()


def test_a_thread_that_ended_falls_back_to_the_ticks() -> None:
    child, clock = _spin(ends=True)
    try:
        seconds, precise = clock.seconds()
        assert not precise
        assert seconds >= 0.3 - TICK_SECONDS
    finally:
        child.kill()
        child.wait()
