"""Run a module as ``python -m`` would and write its peak resident set (the process's own
``VmHWM``, in MiB) to the file named by ``$TOKENPATH_BENCH_PEAK_FILE`` at exit.

``ru_maxrss`` of a child is no measure of it: Linux keeps the high-water mark of the
process that forked it across ``execve``, so a child of a large parent reports the
parent's peak. ``VmHWM`` belongs to the address space ``execve`` made afresh."""

from __future__ import annotations

import atexit
import os
import runpy
import sys

PEAK_FILE_ENV = "TOKENPATH_BENCH_PEAK_FILE"


def _peak_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _write_peak() -> None:
    path = os.environ.get(PEAK_FILE_ENV)
    if path:
        with open(path, "w") as out:
            out.write(f"{_peak_mib():.1f}\n")


if __name__ == "__main__":
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    atexit.register(_write_peak)
    runpy.run_module(module, run_name="__main__", alter_sys=True)
