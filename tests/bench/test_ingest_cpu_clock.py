"""The ingest bench's CPU clock: the scheduler's per-thread nanosecond counts of a real
process, agreeing with psutil's tick count to within its ticks; the tick count where a
thread ended in between (its count left with it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from bench.ingest import CpuClock, process_cpu_seconds

# A second thread is started and said ready; on "go" it spins about 0.3 s of CPU, then
# ends (``ENDS = True``) or stays alive; "spun" and its thread id once it is done.
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
print("spun", worker.native_id, flush=True)
sys.stdin.readline()
"""
TICK_SECONDS = 1.0 / os.sysconf("SC_CLK_TCK")
# psutil reads user and system time as two tick counts, each rounded down: a difference of
# two readings of their sum is short of the true CPU time by less than two ticks.
READ_ERROR_SECONDS = 2 * TICK_SECONDS


def _spin(ends: bool) -> tuple[subprocess.Popen[str], CpuClock, float]:
    """The spinner run to "spun": the clock made before the spin, and psutil's tick count
    read beside it. An ended thread is waited for until the kernel no longer lists it
    (Python's join returns before the OS thread has quite exited)."""
    child = subprocess.Popen([sys.executable, "-c", SPINNER.format(ends=ends)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    process = psutil.Process(child.pid)
    clock = CpuClock(process)  # both threads alive here
    ticks_before = process_cpu_seconds(process)
    child.stdin.write("go\n")
    child.stdin.flush()
    word, tid = child.stdout.readline().split()
    assert word == "spun"
    deadline = time.monotonic() + 60.0
    while ends and os.path.exists(f"/proc/{child.pid}/task/{tid}"):
        assert time.monotonic() < deadline, "the ended thread is still listed"
        time.sleep(0.01)
    return child, clock, ticks_before


def test_the_scheduler_count_agrees_with_the_ticks() -> None:
    child, clock, ticks_before = _spin(ends=False)
    try:
        seconds, precise = clock.seconds()
        ticks = process_cpu_seconds(psutil.Process(child.pid)) - ticks_before
        assert precise
        assert seconds >= 0.3
        assert abs(seconds - ticks) <= 5 * TICK_SECONDS
    finally:
        child.kill()
        child.wait()


def test_a_thread_that_ended_falls_back_to_the_ticks() -> None:
    child, clock, _ = _spin(ends=True)
    try:
        seconds, precise = clock.seconds()
        assert not precise
        assert seconds > 0.3 - READ_ERROR_SECONDS
    finally:
        child.kill()
        child.wait()
