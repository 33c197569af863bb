"""The NVML path through the real nvidia-ml-py over a fake driver library.

``testkit/fakes/libnvml/fake_libnvidia_ml.c`` is compiled to ``libnvidia-ml.so.1``; pynvml
loads it as it loads the NVIDIA driver's, so pynvml's wrappers, ctypes structures, error
classes and the agent's struct decoding all run for real. Only the driver is fake.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from testkit.fakes import fake_libnvml as driver
from testkit.fakes.clock import FakeClock
from testkit.support.processes import stop_process
from tests.agent.conftest import free_port
from tests.agent.test_cli_agent import agent_env, wait_healthy
from tokenpath import metric_names as mn
from tokenpath.agent.nic_sampler import NicSampler
from tokenpath.agent.node_poller import NodePoller
from tokenpath.agent.nvml_sampler import NvmlSampler


@pytest.fixture(scope="module")
def library_dir() -> str:
    try:
        return str(driver.build_fake_libnvml())
    except driver.CompilerMissing as exc:
        pytest.skip(f"{exc} (scripts/install-system-deps.sh installs gcc)")


def poller_for(nvml: object, clock: FakeClock) -> NodePoller:
    sampler = NvmlSampler(nvml, clock)
    sampler.start()
    assert sampler.up, sampler.init_error
    return NodePoller(nvml_sampler=sampler,
                      nic_sampler=NicSampler(source="sysfs",
                                             sysfs_root="/nonexistent-sysfs"),  # type: ignore[arg-type]
                      engine_scraper=None, clock=clock, wall_clock_ns=lambda: 1,
                      max_devices=16, max_sources=16)


def test_every_reading_decodes_from_pynvml_structures(library_dir: str) -> None:
    clock = FakeClock(500.0)
    with driver.real_pynvml_over_fake_library(4, failing=(2,), no_nvlink=(3,),
                                              no_power=(3,)) as (pynvml, library):
        poller = poller_for(pynvml, clock)
        first = poller.poll()
        clock.now += 2.0
        second = poller.poll()
        names = poller.nvml_sampler.device_names()
        library.fakeNvmlResetDevice(0)
        after_reset = poller.poll()
        poller.nvml_sampler.shutdown()
    for index in (0, 1, 3):
        gpu = (str(index),)
        assert second.get(mn.GPU_UTILIZATION, gpu) == pytest.approx(
            driver.utilization_percent(index) / 100)
        assert second.get(mn.GPU_MEMORY_BW_UTIL, gpu) == pytest.approx(
            driver.memory_utilization_percent(index) / 100)
        assert second.get(mn.GPU_MEMORY_USED, gpu) == (index + 1) * 2**30
        assert second.get(mn.GPU_MEMORY_TOTAL, gpu) == driver.MEMORY_TOTAL_BYTES
        assert second.get(mn.GPU_SM_CLOCK, gpu) == driver.SM_CLOCK_MHZ * 1e6
        # The PCIe counters grew by one read's worth over the 2 s between the polls.
        tx_per_read, rx_per_read = driver.pcie_bytes_per_read(index)
        assert first.get(mn.GPU_PCIE_TX, gpu) is None
        assert second.get(mn.GPU_PCIE_TX, gpu) == pytest.approx(tx_per_read / 2.0)
        assert second.get(mn.GPU_PCIE_RX, gpu) == pytest.approx(rx_per_read / 2.0)
        assert second.get(mn.GPU_BUSY_SECONDS, gpu) == pytest.approx(
            2.0 * driver.utilization_percent(index) / 100)
    assert second.get(mn.GPU_POWER, ("1",)) == driver.power_milliwatts(1) / 1000
    # GPU 2 answers GPU_IS_LOST: counted every poll, no series.
    assert second.get(mn.GPU_UTILIZATION, ("2",)) is None
    assert second.get(mn.AGENT_SCRAPE_ERRORS, ("nvml:gpu2",)) == 2.0
    # GPU 3 has no NVLink and no power reading: absent, not an error.
    assert second.get(mn.GPU_NVLINK_TX, ("3",)) is None
    assert second.get(mn.GPU_POWER, ("3",)) is None
    assert second.get(mn.AGENT_SCRAPE_ERRORS, ("nvml:gpu3",)) is None
    # NVLink counters (KiB) grow by (index + 1) KiB-per-read units on every read.
    kib = driver.NVLINK_KIB_PER_READ * 1024
    assert first.get(mn.GPU_NVLINK_TX, ("1",)) == 2 * kib
    assert second.get(mn.GPU_NVLINK_TX, ("1",)) == 4 * kib
    assert second.get(mn.GPU_NVLINK_RX, ("0",)) == 4 * kib
    # A device reset zeroes the driver's counters; the agent's total keeps growing.
    assert second.get(mn.GPU_NVLINK_TX, ("0",)) == 2 * kib
    assert after_reset.get(mn.GPU_NVLINK_TX, ("0",)) == 3 * kib
    assert names[0] == "Fake GPU 0 (tokenpath test driver)"
    assert 2 not in names


def test_pynvml_is_put_back_as_it_was_afterwards(library_dir: str) -> None:
    import pynvml

    before = pynvml.nvmlLib
    with driver.real_pynvml_over_fake_library(1) as (_pynvml, library):
        assert pynvml.nvmlLib is library
    assert pynvml.nvmlLib is before
    if before is None:  # no driver on this machine: pynvml is uninitialised again
        with pytest.raises(pynvml.NVMLError):
            pynvml.nvmlDeviceGetCount()


@pytest.mark.integration
def test_agent_subprocess_loads_the_driver_library_like_a_gpu_node(library_dir: str) -> None:
    env = agent_env(**driver.driver_env(2, failing=(1,)),
                    LD_LIBRARY_PATH=os.pathsep.join(
                        filter(None, [library_dir, os.environ.get("LD_LIBRARY_PATH")])))
    once = subprocess.run(
        [sys.executable, "-m", "tokenpath.cli.main", "agent", "--once", "--format", "json",
         "--node", "fake-gpu-node"],
        env=env, capture_output=True, timeout=60, check=True,
    )
    payload = json.loads(once.stdout)
    assert payload["nvml_up"] is True
    assert payload["gpu_names"] == {"0": "Fake GPU 0 (tokenpath test driver)"}
    assert payload["metrics"][mn.GPU_MEMORY_TOTAL.series] == [
        {"labels": {"gpu": "0"}, "value": driver.MEMORY_TOTAL_BYTES}]

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-m", "tokenpath.cli.main", "agent", "--listen", f"127.0.0.1:{port}",
         "--interval", "0.2", "--node", "fake-gpu-node"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        wait_healthy(base, process)
        time.sleep(0.6)  # a few polls, so the PCIe rates exist
        text = httpx.get(base + "/metrics").text
    finally:
        stop_process(process)
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text) for s in family.samples
    }
    gpu0 = (("gpu", "0"),)
    assert values[(mn.AGENT_NVML_UP.series, ())] == 1.0
    assert values[(mn.GPU_UTILIZATION.series, gpu0)] == pytest.approx(0.1)
    assert values[(mn.GPU_NVLINK_TX.series, gpu0)] > 0
    assert values[(mn.GPU_PCIE_TX.series, gpu0)] > 0
    assert values[(mn.AGENT_SCRAPE_ERRORS.series, (("source", "nvml:gpu1"),))] >= 1
    assert process.returncode == 0


def test_the_fake_driver_counts_inits_like_the_driver(library_dir: str) -> None:
    """nvmlInit is reference counted: the agent's NVML stays up while another user in the
    same process (the bench's probe) initialises and shuts down around it."""
    with driver.real_pynvml_over_fake_library(2) as (pynvml, _library):
        pynvml.nvmlInit()
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        assert pynvml.nvmlDeviceGetCount() == 2  # one init still open
        pynvml.nvmlShutdown()
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlDeviceGetCount()


def test_a_gpu_without_utilization_keeps_its_row_through_real_pynvml(
        library_dir: str) -> None:
    clock = FakeClock(500.0)
    with driver.real_pynvml_over_fake_library(2, no_utilization=(1,)) as (pynvml, _library):
        poller = poller_for(pynvml, clock)
        poller.poll()
        clock.now += 1.0
        second = poller.poll()
        poller.nvml_sampler.shutdown()
    # pynvml raises NVMLError_NotSupported: the GPU's other readings stay, no error.
    assert second.get(mn.GPU_UTILIZATION, ("1",)) is None
    assert second.get(mn.GPU_MEMORY_USED, ("1",)) == 2 * 2**30
    assert second.get(mn.GPU_POWER, ("1",)) == driver.power_milliwatts(1) / 1000
    assert second.get(mn.AGENT_SCRAPE_ERRORS, ("nvml:gpu1",)) is None
    assert second.get(mn.GPU_UTILIZATION, ("0",)) == pytest.approx(
        driver.utilization_percent(0) / 100)
