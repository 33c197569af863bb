"""Node agent benchmark (docs/performance.md: agent <= 0.5% of one core at 1 Hz).

There is no GPU on the machines this runs on (docs/agent.md). NVML is the real
nvidia-ml-py (``pynvml``) over a fake driver library, ``testkit/fakes/libnvml`` compiled to
``libnvidia-ml.so.1`` with 8 GPUs: pynvml's own wrappers and ctypes structures run as in
production, and only the driver call itself is fake (and near-free, where a real
driver's ioctl is not). Where no C compiler exists, both measurements fall back to the
pure-Python fake module (``testkit/fakes/fake_nvml.py``) and say so in ``nvml``.

- ``cpu_share``: ``tokenpath agent`` logic (AgentService with 8 GPUs, real psutil, one
  vLLM-format and one SGLang-format engine page on loopback fetched every
  ``engine_interval``, OTLP push to a loopback sink at the default push interval) runs
  in a child process at 1 Hz while this process scrapes its /metrics every 15 s; the
  child's CPU clock over wall time is its share of one core. Target <= 0.005. Two
  baselines run in windows of their own, alternating with the agent's: a process making
  only the raw psutil and NVML calls of a poll at 1 Hz, and one that only wakes at 1 Hz.
  Then, agent only: a scrape every second, and the engine pages fetched every poll.
- ``wake_penalty``: what this machine charges for touching memory after a sleep: the
  CPU time of reading one byte from each of ``PENALTY_PAGES`` pages right after a 1 s
  sleep, against the same read back to back (``wake_penalty_ratio``). On a normal host
  a 1 s sleep costs a few cache misses; on a VM whose page tables are shadowed by the
  hypervisor (this development VM boots with ``nested_pvm=1``) each page touched after
  the sleep can fault into the hypervisor, and every figure of the CPU share scales
  with the pages a wake-up touches. It calibrates the CPU share, not the agent.
- ``poll_cost_ratio``: one poll (NVML + NIC part) against the raw psutil and NVML calls
  that poll makes, timed alternately in this process. Target <= 1.5. A poll records
  rows; its snapshot builds series only when first read, so
  ``poll_and_read_cost_ratio`` (a poll whose snapshot is then read, as when a scrape or
  push follows it) is reported beside it, and so is the ratio against the pure-Python
  fake module (``python_fake_module``).

``python -m bench.agent_bench [--window 10] [--nvml driver]`` prints the result as JSON;
``--nvml driver`` runs the agent over this machine's NVIDIA driver instead of the fake
one, to measure it on a GPU node.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import psutil

from testkit.fakes.engine_pages import render_sglang, render_vllm
from testkit.fakes.fake_libnvml import (
    CompilerMissing,
    build_fake_libnvml,
    driver_env,
    real_pynvml_over_fake_library,
)
from testkit.fakes.fake_nvml import FakeGpu, FakeNvml
from tokenpath.agent.config import DEFAULT_ENGINE_INTERVAL_SECONDS, AgentConfig
from tokenpath.agent.nic_sampler import NicSampler
from tokenpath.agent.node_poller import NodePoller
from tokenpath.agent.nvml_sampler import NvmlSampler
from tokenpath.agent.service import AgentService

CPU_SHARE_TARGET = 0.005
POLL_COST_RATIO_TARGET = 1.5
BENCH_GPUS = 8
DEFAULT_WINDOW_SECONDS = 10.0
PROMETHEUS_SCRAPE_SECONDS = 15.0
WARMUP_SECONDS = 2.0
# The wake-penalty calibration: pages read after each sleep, sleeps, and their length.
PENALTY_PAGES = 1000
PENALTY_SAMPLES = 5
PENALTY_SLEEP_SECONDS = 1.0
PAGE_BYTES = 4096
READY_LINE = "ready"
CPU_LINE = "cpu"
# What NVML the agent runs over: the fake driver library (no GPU here), or this machine's
# NVIDIA driver (`--nvml driver`, on a GPU node).
FAKE_DRIVER = "fake-driver"
SYSTEM_DRIVER = "driver"
NVML_SOURCES = (FAKE_DRIVER, SYSTEM_DRIVER)
# The processes whose CPU share is measured.
AGENT = "agent"
RAW_CALLS = "raw_calls"
IDLE_WAKE = "idle_wake"


def fake_gpus(count: int = BENCH_GPUS) -> FakeNvml:
    return FakeNvml([FakeGpu(nvlink_tx_kib=i * 1000, nvlink_rx_kib=i * 2000)
                     for i in range(count)])


# -- poll cost against the raw calls ------------------------------------------------------

def _raw_calls(nvml: Any) -> Callable[[], None]:
    """Exactly the psutil and NVML calls one poll makes, with nothing around them."""
    fields = [(nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0xFFFFFFFF),
              (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 0xFFFFFFFF),
              (nvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, 0),
              (nvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, 0)]
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]

    def run() -> None:
        psutil.net_io_counters(pernic=True, nowrap=False)
        nvml.nvmlDeviceGetCount()
        for handle in handles:
            nvml.nvmlDeviceGetUtilizationRates(handle)
            nvml.nvmlDeviceGetMemoryInfo(handle)
            nvml.nvmlDeviceGetPowerUsage(handle)
            nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)
            nvml.nvmlDeviceGetFieldValues(handle, fields)

    return run


def _time_batch(fn: Callable[[], Any], iterations: int) -> float:
    start = time.process_time()
    for _ in range(iterations):
        fn()
    return (time.process_time() - start) / iterations


def measure_poll_cost(nvml: Any, iterations: int = 300,
                      rounds: int = 7) -> dict[str, float]:
    """Median-of-rounds seconds per poll, per poll whose snapshot is then read, and per
    raw-call set, alternated in one run."""
    sampler = NvmlSampler(nvml, time.monotonic)
    sampler.start()
    poller = NodePoller(nvml_sampler=sampler, nic_sampler=NicSampler(source="psutil"),
                        engine_scraper=None, clock=time.monotonic, wall_clock_ns=time.time_ns,
                        max_devices=64, max_sources=64)
    if not sampler.up:
        raise RuntimeError(f"bench NVML did not initialise: {sampler.init_error}")

    def poll_and_read() -> None:
        poller.poll().points  # noqa: B018 -- the first read builds the series

    raw = _raw_calls(nvml)
    poll_and_read()
    raw()
    polls: list[float] = []
    reads: list[float] = []
    raws: list[float] = []
    for _ in range(rounds):
        polls.append(_time_batch(poller.poll, iterations))
        reads.append(_time_batch(poll_and_read, iterations))
        raws.append(_time_batch(raw, iterations))
    sampler.shutdown()
    poll_s = sorted(polls)[rounds // 2]
    read_s = sorted(reads)[rounds // 2]
    raw_s = sorted(raws)[rounds // 2]
    return {"poll_seconds": poll_s, "poll_and_read_seconds": read_s,
            "raw_calls_seconds": raw_s, "poll_cost_ratio": poll_s / raw_s,
            "poll_and_read_cost_ratio": read_s / raw_s}


def measure_poll_costs(nvml_source: str = FAKE_DRIVER) -> dict[str, Any]:
    """The poll cost with real pynvml over the fake driver, or over this machine's driver
    (``nvml_source``; the headline), and with the pure-Python fake module."""
    gpus = _probe_system_driver() if nvml_source == SYSTEM_DRIVER else 0
    python_fake = measure_poll_cost(fake_gpus())
    if nvml_source == SYSTEM_DRIVER:
        import pynvml

        headline = measure_poll_cost(pynvml)
        nvml = f"real pynvml over this machine's NVIDIA driver ({gpus} GPUs)"
    else:
        try:
            with real_pynvml_over_fake_library(BENCH_GPUS) as (pynvml, _library):
                headline = measure_poll_cost(pynvml)
            nvml = f"real pynvml over a fake libnvidia-ml.so.1 ({BENCH_GPUS} GPUs; no GPU here)"
        except CompilerMissing:
            headline = python_fake
            nvml = f"pure-Python fake pynvml module ({BENCH_GPUS} GPUs; no C compiler, no GPU)"
    return {"nvml": nvml, **headline, "python_fake_module": python_fake}


def _probe_system_driver() -> int:
    """This machine's GPU count through its NVIDIA driver, or a RuntimeError that says
    the driver is missing (measure_poll_cost initialises NVML again for itself)."""
    import pynvml

    try:
        pynvml.nvmlInit()
        gpus = int(pynvml.nvmlDeviceGetCount())
        pynvml.nvmlShutdown()
    except pynvml.NVMLError as exc:
        raise RuntimeError(f"--nvml {SYSTEM_DRIVER}: NVML did not initialise on this "
                           f"machine ({exc}); is the NVIDIA driver installed?") from exc
    return gpus


# -- what a wake-up costs on this machine ------------------------------------------------

def measure_wake_penalty(pages: int = PENALTY_PAGES, samples: int = PENALTY_SAMPLES,
                         sleep_seconds: float = PENALTY_SLEEP_SECONDS) -> dict[str, float]:
    """CPU time of reading one byte of each of ``pages`` pages right after sleeping
    ``sleep_seconds``, against the same read back to back (medians of ``samples``)."""
    memory = bytearray(pages * PAGE_BYTES)
    offsets = range(0, len(memory), PAGE_BYTES)
    for offset in offsets:  # every page backed before timing
        memory[offset] = 1

    def touch() -> float:
        start = time.process_time()
        total = 0
        for offset in offsets:
            total += memory[offset]
        return time.process_time() - start

    warm = [touch() for _ in range(samples + 1)][1:]
    cold: list[float] = []
    for _ in range(samples):
        time.sleep(sleep_seconds)
        cold.append(touch())
    warm_s = statistics.median(warm)
    cold_s = statistics.median(cold)
    return {"pages": pages, "sleep_seconds": sleep_seconds,
            "warm_us_per_page": 1e6 * warm_s / pages,
            "after_sleep_us_per_page": 1e6 * cold_s / pages,
            "wake_penalty_ratio": cold_s / warm_s if warm_s > 0 else float("inf")}


# -- CPU share of a running agent ---------------------------------------------------------

class _QuietServer(ThreadingHTTPServer):
    """Says nothing when a stopped child drops its connection (an engine request sent
    and never read is cancelled at shutdown)."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _LoopbackFixtures:
    """Engine pages and an OTLP sink in the parent, so their CPU is not the agent's."""

    def __init__(self) -> None:
        pages = {"/vllm": render_vllm().encode(), "/sglang": render_sglang().encode()}
        self.pushes = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            disable_nagle_algorithm = True
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                body = pages.get(self.path, b"")
                self.send_response(200 if body else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                owner.pushes += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _child(listen: str, engines: list[str], collector: str, interval: float,
           engine_interval: float, real_pynvml: bool) -> None:
    config = AgentConfig(listen=listen, collector_url=collector or None,
                         interval_seconds=interval, engine_interval_seconds=engine_interval,
                         engine_metrics_urls=tuple(engines), node="bench-node")
    # With real_pynvml, pynvml finds the fake libnvidia-ml.so.1 through LD_LIBRARY_PATH
    # (set by the parent), as it finds a driver's; otherwise the pure-Python fake module.
    service = AgentService(config) if real_pynvml else AgentService(config, nvml=fake_gpus())
    stop = _answer_signals()
    service.start()
    service.settle_heap()  # as `tokenpath agent` does after start
    if not service.nvml_sampler.up:
        raise SystemExit(f"bench agent: NVML did not initialise: {service.nvml_sampler.init_error}")
    print(f"{READY_LINE} {service.listen_port}", flush=True)
    stop.wait()
    service.shutdown()


def _answer_signals() -> threading.Event:
    """SIGTERM sets the returned event; SIGUSR1 prints this process's CPU clock (ns
    resolution; psutil's cpu_times() only has clock-tick, 10 ms, resolution)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1,
                  lambda *_: print(f"{CPU_LINE} {time.process_time()!r}", flush=True))
    return stop


def _baseline_child(interval: float, real_pynvml: bool, calls: bool) -> None:
    """A process that wakes every ``interval`` from the same kind of wait as the agent's
    poll thread and makes the raw psutil and NVML calls of a poll (``calls``) or nothing
    at all: what sampling the node, or merely waking, costs on this machine."""
    stop = _answer_signals()
    if real_pynvml:
        import pynvml

        nvml: Any = pynvml
    else:
        nvml = fake_gpus()
    nvml.nvmlInit()
    work = _raw_calls(nvml) if calls else (lambda: None)
    gc.collect()
    gc.freeze()  # as settle_heap() does for the agent

    def loop() -> None:
        while not stop.wait(interval):
            work()

    threading.Thread(target=loop, daemon=True).start()
    print(f"{READY_LINE} 0", flush=True)
    stop.wait()


class _Child:
    """A bench child process: started, asked for its CPU clock, stopped."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
        assert self.process.stdout is not None
        self._stdout = self.process.stdout
        line = self._stdout.readline().split()
        if not line or line[0] != READY_LINE:
            self.stop()
            raise RuntimeError(f"bench child {command[3:5]} failed to start")
        self.port = int(line[1])

    def cpu(self) -> float:
        """The child's CPU clock in seconds."""
        self.process.send_signal(signal.SIGUSR1)
        reply = self._stdout.readline().split()
        if not reply or reply[0] != CPU_LINE:
            raise RuntimeError(f"bench child answered {reply!r}")
        return float(reply[1])

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=30)


def _child_env_and_flags(nvml_source: str) -> tuple[dict[str, str], list[str]]:
    """The children's environment, and ``--real-pynvml`` where the fake driver library
    could be built (pynvml then finds it through LD_LIBRARY_PATH, as it finds a driver's)
    or where this machine's driver is asked for."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    if nvml_source == SYSTEM_DRIVER:
        return env, ["--real-pynvml"]
    try:
        library_dir = build_fake_libnvml()
    except CompilerMissing:
        return env, []
    env.update(driver_env(BENCH_GPUS))
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        [str(library_dir), *filter(None, [os.environ.get("LD_LIBRARY_PATH")])])
    return env, ["--real-pynvml"]


def _measure_window(child: _Child, window: float, metrics_url: str | None,
                    scrape_interval: float) -> tuple[float, float, int]:
    """``(cpu seconds, wall seconds, scrapes)`` of ``child`` over ``window`` seconds,
    scraping ``metrics_url`` (when given) every ``scrape_interval`` as Prometheus would."""
    time.sleep(WARMUP_SECONDS)
    scrapes = 0
    with httpx.Client() as client:
        cpu_start = child.cpu()
        wall_start = time.monotonic()
        wall_end = wall_start + window
        next_scrape = wall_start
        while (now := time.monotonic()) < wall_end:
            if metrics_url is not None and now >= next_scrape:
                client.get(metrics_url).raise_for_status()
                scrapes += 1
                next_scrape += scrape_interval
            wake = min(next_scrape, wall_end) if metrics_url is not None else wall_end
            time.sleep(max(0.0, wake - time.monotonic()))
        cpu = child.cpu() - cpu_start
        wall = time.monotonic() - wall_start
    return cpu, wall, scrapes


def measure_cpu_share(window: float = DEFAULT_WINDOW_SECONDS, rounds: int = 2,
                      interval: float = 1.0,
                      scrape_interval: float = PROMETHEUS_SCRAPE_SECONDS, *,
                      engines: bool = True,
                      engine_interval: float = DEFAULT_ENGINE_INTERVAL_SECONDS,
                      push: bool = True, baselines: bool = True,
                      nvml_source: str = FAKE_DRIVER) -> dict[str, Any]:
    """The agent child's CPU share of one core at ``interval``, median over ``rounds``
    windows; with ``baselines``, also that of a process making only the raw calls of a
    poll at the same interval (``raw_calls``) and of one that only wakes (``idle_wake``).

    Each process runs alone in its window, in an order that alternates between rounds:
    on this VM a process that wakes right after another Python process finds the
    interpreter's shared code warm, so run side by side they lower each other's
    figures, by a share that depends on their phase."""
    fixtures = _LoopbackFixtures()
    env, nvml_flags = _child_env_and_flags(nvml_source)
    module = [sys.executable, "-m", "bench.agent_bench", "--interval", str(interval),
              *nvml_flags]
    commands = {AGENT: [*module, "--child", "--listen", "127.0.0.1:0",
                        "--engine-interval", str(engine_interval)]}
    if push:
        commands[AGENT] += ["--collector", fixtures.base_url]
    if engines:
        commands[AGENT] += ["--engine", fixtures.base_url + "/vllm",
                            "--engine", fixtures.base_url + "/sglang"]
    if baselines:
        commands[RAW_CALLS] = [*module, "--baseline-child"]
        commands[IDLE_WAKE] = [*module, "--baseline-child", "--no-calls"]
    shares: dict[str, list[float]] = {kind: [] for kind in commands}
    scrapes = 0
    try:
        for round_index in range(rounds):
            order = list(commands) if round_index % 2 == 0 else list(reversed(commands))
            for kind in order:
                child = _Child(commands[kind], env)
                try:
                    url = f"http://127.0.0.1:{child.port}/metrics" if kind == AGENT else None
                    cpu, wall, scraped = _measure_window(child, window, url, scrape_interval)
                finally:
                    child.stop()
                shares[kind].append(cpu / wall)
                scrapes += scraped
    finally:
        fixtures.close()
    result: dict[str, Any] = {
        f"{kind}_share_of_one_core": statistics.median(values)
        for kind, values in shares.items()
    }
    result.update(windows=shares, window_seconds=window,
                  scrape_interval_seconds=scrape_interval, agent_scrapes=scrapes,
                  otlp_pushes=fixtures.pushes)
    return result


def run(window: float = DEFAULT_WINDOW_SECONDS, nvml_source: str = FAKE_DRIVER) -> dict[str, Any]:
    """Both measurements with their targets (``cpu_percent_of_core`` and ``poll_ratio``
    are the figures ``python -m bench`` tabulates).

    The CPU share is taken at the defaults with one Prometheus scrape every
    ``PROMETHEUS_SCRAPE_SECONDS`` (a common ServiceMonitor setting; the headline figure),
    alternating with the raw-calls and idle-wake processes over two rounds; then, agent
    only, with one scrape every second and with the engine pages fetched every poll
    instead of every ``engine_interval`` (the pessimistic cases, reported beside).
    """
    cost = measure_poll_costs(nvml_source)  # first: it names a missing driver plainly
    penalty = measure_wake_penalty()
    typical = measure_cpu_share(window, rounds=2, nvml_source=nvml_source)
    every_second = measure_cpu_share(window, rounds=1, scrape_interval=1.0, baselines=False,
                                     nvml_source=nvml_source)
    engines_every_poll = measure_cpu_share(window, rounds=1, engine_interval=1.0,
                                           baselines=False, nvml_source=nvml_source)
    return {
        "cpu_percent_of_core": 100.0 * typical["agent_share_of_one_core"],
        "cpu_percent_of_core_scrape_every_second":
            100.0 * every_second["agent_share_of_one_core"],
        "cpu_percent_of_core_engines_every_poll":
            100.0 * engines_every_poll["agent_share_of_one_core"],
        # Alone, in the windows alternating with the headline's: the raw calls of a poll
        # at 1 Hz, and a process that only wakes at 1 Hz.
        "cpu_percent_of_core_raw_calls_1hz": 100.0 * typical["raw_calls_share_of_one_core"],
        "cpu_percent_of_core_idle_wake_1hz": 100.0 * typical["idle_wake_share_of_one_core"],
        "cpu_percent_target": 100.0 * CPU_SHARE_TARGET,
        "poll_ratio": cost["poll_cost_ratio"],
        "poll_ratio_target": POLL_COST_RATIO_TARGET,
        "cpu_typical_scrapes": typical,
        "cpu_scrape_every_second": every_second,
        "cpu_engines_every_poll": engines_every_poll,
        "wake_penalty": penalty,
        "wake_penalty_ratio": penalty["wake_penalty_ratio"],
        **cost,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.agent_bench")
    parser.add_argument("--window", type=float, default=DEFAULT_WINDOW_SECONDS,
                        help="seconds each CPU-share window lasts")
    parser.add_argument("--nvml", choices=NVML_SOURCES, default=FAKE_DRIVER,
                        help="NVML under the agent: the fake driver library built from "
                             "testkit/fakes (default), or this machine's NVIDIA driver (on a "
                             "GPU node)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--baseline-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-calls", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--listen", default="127.0.0.1:0", help=argparse.SUPPRESS)
    parser.add_argument("--interval", type=float, default=1.0, help=argparse.SUPPRESS)
    parser.add_argument("--engine-interval", type=float,
                        default=DEFAULT_ENGINE_INTERVAL_SECONDS, help=argparse.SUPPRESS)
    parser.add_argument("--collector", default="", help=argparse.SUPPRESS)
    parser.add_argument("--engine", action="append", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--real-pynvml", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.baseline_child:
        _baseline_child(args.interval, args.real_pynvml, calls=not args.no_calls)
        return
    if args.child:
        _child(args.listen, args.engine, args.collector, args.interval, args.engine_interval,
               args.real_pynvml)
        return
    try:
        result = run(args.window, args.nvml)
    except RuntimeError as exc:
        raise SystemExit(f"agent bench: {exc}") from exc
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
