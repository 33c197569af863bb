"""NVML path against the fake ``pynvml`` (no GPU on these machines)."""

from __future__ import annotations

import inspect
import itertools

import pynvml
import pytest

from testkit.fakes.clock import FakeClock
from testkit.fakes.fake_nvml import (
    AGENT_NVML_FUNCTIONS,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_NO_PERMISSION,
    NVML_VALUE_TYPE_UNSIGNED_INT,
    FakeGpu,
    FakeNvml,
)
from tokenpath import metric_names as mn
from tokenpath.agent.nic_sampler import NicSampler
from tokenpath.agent.node_poller import NodePoller
from tokenpath.agent.nvml_sampler import NvmlSampler
from tokenpath.agent.snapshot import ErrorCounts
from tokenpath.labels import BoundedLabel


def make_poller(nvml: object, clock: FakeClock, tmp_path: object = None) -> NodePoller:
    sampler = NvmlSampler(nvml, clock, retry_seconds=30.0)
    sampler.start()
    # NICs from an empty sysfs tree: this file is about GPUs.
    nics = NicSampler(source="sysfs", sysfs_root=tmp_path or "/nonexistent-sysfs")  # type: ignore[arg-type]
    return NodePoller(nvml_sampler=sampler, nic_sampler=nics, engine_scraper=None,
                      clock=clock, wall_clock_ns=lambda: 1, max_devices=16, max_sources=32)


def four_gpus() -> list[FakeGpu]:
    return [
        FakeGpu(utilization_percent=80, nvlink_tx_kib=1000, nvlink_rx_kib=2000),
        FakeGpu(utilization_percent=40, nvlink_tx_kib=500, nvlink_rx_kib=700),
        FakeGpu(failing=True),
        FakeGpu(has_nvlink=False, has_power=False),
    ]


def test_several_gpus_with_one_failing_counts_the_failure_and_reports_the_rest() -> None:
    nvml = FakeNvml(four_gpus())
    poller = make_poller(nvml, FakeClock(1000.0))
    snap = poller.poll()
    assert snap.get(mn.AGENT_NVML_UP) == 1.0
    assert snap.get(mn.GPU_UTILIZATION, ("0",)) == pytest.approx(0.8)
    assert snap.get(mn.GPU_UTILIZATION, ("1",)) == pytest.approx(0.4)
    assert snap.get(mn.GPU_UTILIZATION, ("2",)) is None
    assert snap.get(mn.GPU_UTILIZATION, ("3",)) == pytest.approx(0.5)
    assert snap.get(mn.GPU_MEMORY_BW_UTIL, ("0",)) == pytest.approx(0.3)
    assert snap.get(mn.GPU_MEMORY_USED, ("0",)) == 40 * 2**30
    assert snap.get(mn.GPU_MEMORY_TOTAL, ("0",)) == 80 * 2**30
    assert snap.get(mn.GPU_POWER, ("0",)) == pytest.approx(350.0)
    assert snap.get(mn.GPU_SM_CLOCK, ("0",)) == pytest.approx(1980e6)
    # PCIe throughput is a rate between two polls: none on the first.
    assert snap.get(mn.GPU_PCIE_TX, ("0",)) is None
    assert snap.get(mn.GPU_NVLINK_TX, ("0",)) == 1000 * 1024
    assert snap.get(mn.GPU_NVLINK_RX, ("1",)) == 700 * 1024
    # The failing GPU is counted once per poll under its own source.
    assert snap.get(mn.AGENT_SCRAPE_ERRORS, ("nvml:gpu2",)) == 1.0
    # NOT_SUPPORTED (no NVLink, no power on GPU 3) is not an error and is simply absent.
    assert snap.get(mn.GPU_NVLINK_TX, ("3",)) is None
    assert snap.get(mn.GPU_POWER, ("3",)) is None
    assert snap.get(mn.AGENT_SCRAPE_ERRORS, ("nvml:gpu3",)) is None
    poller.poll()
    assert poller.errors.get("nvml:gpu2") == 2.0


def test_unsupported_calls_are_not_repeated() -> None:
    nvml = FakeNvml([FakeGpu(has_nvlink=False, has_power=False, has_pcie_counters=False)])
    poller = make_poller(nvml, FakeClock(1000.0))
    for _ in range(3):
        poller.poll()
    assert nvml.calls["nvmlDeviceGetPowerUsage"] == 1
    assert nvml.calls["nvmlDeviceGetFieldValues"] == 1
    assert nvml.calls["nvmlDeviceGetUtilizationRates"] == 3


def test_pcie_throughput_is_the_byte_counters_increase_over_the_poll_interval() -> None:
    clock = FakeClock(1000.0)
    gpus = [FakeGpu(pcie_tx_bytes=1_000, pcie_rx_bytes=5_000, has_nvlink=False)]
    nvml = FakeNvml(gpus)
    poller = make_poller(nvml, clock)
    assert poller.poll().get(mn.GPU_PCIE_TX, ("0",)) is None
    clock.now += 2.0
    gpus[0].pcie_tx_bytes += 4_000_000
    gpus[0].pcie_rx_bytes += 1_000_000
    snap = poller.poll()
    assert snap.get(mn.GPU_PCIE_TX, ("0",)) == pytest.approx(2_000_000)
    assert snap.get(mn.GPU_PCIE_RX, ("0",)) == pytest.approx(500_000)
    # The NVLink pair is unsupported on this GPU and was dropped; PCIe is still asked for.
    assert snap.get(mn.GPU_NVLINK_TX, ("0",)) is None
    # A 64-bit counter that went down was reset: it counted from zero since.
    clock.now += 1.0
    gpus[0].pcie_tx_bytes = 10
    assert poller.poll().get(mn.GPU_PCIE_TX, ("0",)) == pytest.approx(10)
    clock.now += 1.0
    gpus[0].pcie_tx_bytes = 1_010
    assert poller.poll().get(mn.GPU_PCIE_TX, ("0",)) == pytest.approx(1_000)
    # Never the PCIe throughput call: NVML samples it over a 20 ms window per call.
    assert nvml.calls["nvmlDeviceGetPcieThroughput"] == 0


def test_32_bit_counters_wrap_instead_of_resetting() -> None:
    clock = FakeClock(1000.0)
    top = 2**32
    gpus = [FakeGpu(counter_value_type=NVML_VALUE_TYPE_UNSIGNED_INT, nvlink_tx_kib=top - 100,
                    pcie_tx_bytes=top - 1_000, pcie_rx_bytes=0)]
    poller = make_poller(FakeNvml(gpus), clock)
    poller.poll()
    clock.now += 1.0
    gpus[0].nvlink_tx_kib = 50  # past 2**32 KiB: 150 KiB more
    gpus[0].pcie_tx_bytes = 3_000  # past 2**32 bytes: 4,000 bytes more
    snap = poller.poll()
    assert snap.get(mn.GPU_NVLINK_TX, ("0",)) == (top - 100 + 150) * 1024
    assert snap.get(mn.GPU_PCIE_TX, ("0",)) == pytest.approx(4_000)


def test_without_pcie_throughput_the_fields_request_has_only_nvlink() -> None:
    nvml = FakeNvml([FakeGpu(nvlink_tx_kib=1)])
    sampler = NvmlSampler(nvml, FakeClock(1000.0), pcie_throughput=False)
    sampler.start()
    poller = NodePoller(nvml_sampler=sampler, nic_sampler=NicSampler(
        source="sysfs", sysfs_root="/nonexistent-sysfs"),  # type: ignore[arg-type]
        engine_scraper=None, clock=FakeClock(1000.0), wall_clock_ns=lambda: 1,
        max_devices=4, max_sources=4)
    poller.poll()
    snap = poller.poll()
    assert snap.get(mn.GPU_NVLINK_TX, ("0",)) == 1024
    assert mn.GPU_PCIE_TX not in snap.points


def test_nvlink_counters_never_go_backwards_across_a_device_reset() -> None:
    gpus = [FakeGpu(nvlink_tx_kib=1000, nvlink_rx_kib=4000)]
    nvml = FakeNvml(gpus)
    poller = make_poller(nvml, FakeClock(1000.0))
    first = poller.poll().get(mn.GPU_NVLINK_TX, ("0",))
    assert first == 1000 * 1024
    gpus[0].nvlink_tx_kib = 1500
    assert poller.poll().get(mn.GPU_NVLINK_TX, ("0",)) == 1500 * 1024
    gpus[0].reset()
    gpus[0].nvlink_tx_kib = 200
    after_reset = poller.poll()
    assert after_reset.get(mn.GPU_NVLINK_TX, ("0",)) == (1500 + 200) * 1024
    assert after_reset.get(mn.GPU_NVLINK_RX, ("0",)) == 4000 * 1024


def test_gpu_that_fails_then_recovers_gets_a_fresh_handle() -> None:
    gpus = [FakeGpu(failing=True)]
    nvml = FakeNvml(gpus)
    poller = make_poller(nvml, FakeClock(1000.0))
    assert poller.poll().get(mn.GPU_UTILIZATION, ("0",)) is None
    gpus[0].failing = False
    assert poller.poll().get(mn.GPU_UTILIZATION, ("0",)) == pytest.approx(0.5)
    assert nvml.calls["nvmlDeviceGetHandleByIndex"] == 2


def test_busy_seconds_integrate_utilization_over_elapsed_time() -> None:
    clock = FakeClock(1000.0)
    gpus = [FakeGpu(utilization_percent=50)]
    poller = make_poller(FakeNvml(gpus), clock)
    assert poller.poll().get(mn.GPU_BUSY_SECONDS, ("0",)) == 0.0
    clock.now += 2.0
    assert poller.poll().get(mn.GPU_BUSY_SECONDS, ("0",)) == pytest.approx(1.0)
    gpus[0].utilization_percent = 100
    clock.now += 1.0
    assert poller.poll().get(mn.GPU_BUSY_SECONDS, ("0",)) == pytest.approx(2.0)
    # A long gap (agent stalled, GPU unreadable) is not guessed.
    clock.now += 3600.0
    assert poller.poll().get(mn.GPU_BUSY_SECONDS, ("0",)) == pytest.approx(2.0)


def test_without_a_driver_nvml_up_is_zero_and_the_poll_still_works(tmp_path: object) -> None:
    clock = FakeClock(1000.0)
    nvml = FakeNvml(library_missing=True)
    poller = make_poller(nvml, clock)
    snap = poller.poll()
    assert snap.get(mn.AGENT_NVML_UP) == 0.0
    assert mn.GPU_UTILIZATION not in snap.points
    assert snap.get(mn.AGENT_SCRAPE_ERRORS, ("nvml",)) is None
    # Init is retried only after retry_seconds.
    poller.poll()
    assert nvml.calls["nvmlInit"] == 1
    clock.now += 31.0
    nvml.library_missing = False
    assert poller.poll().get(mn.AGENT_NVML_UP) == 1.0
    assert nvml.calls["nvmlInit"] == 2


def test_no_nvml_module_at_all() -> None:
    sampler = NvmlSampler(None, FakeClock(1000.0))
    sampler.start()
    assert not sampler.up
    readings = sampler.read(ErrorCounts(8), BoundedLabel(8))
    assert not readings.rows
    assert sampler.init_error is not None


def test_never_asks_for_process_lists() -> None:
    nvml = FakeNvml(four_gpus())
    poller = make_poller(nvml, FakeClock(1000.0))
    for _ in range(3):
        poller.poll()
    called = set(nvml.calls)
    assert "nvmlDeviceGetComputeRunningProcesses" not in called
    assert called <= set(AGENT_NVML_FUNCTIONS)


@pytest.mark.parametrize("name", AGENT_NVML_FUNCTIONS)
def test_fake_matches_the_real_pynvml_signature(name: str) -> None:
    real = inspect.signature(getattr(pynvml, name))
    fake = inspect.signature(getattr(FakeNvml(), name))
    assert list(real.parameters)[: len(fake.parameters)] == list(fake.parameters)[
        : len(real.parameters)
    ]
    required = [p for p in real.parameters.values() if p.default is inspect.Parameter.empty]
    assert len(required) <= len(fake.parameters)


def test_fake_constants_match_pynvml() -> None:
    fake = FakeNvml()
    for constant in ("NVML_ERROR_NOT_SUPPORTED", "NVML_CLOCK_SM", "NVML_PCIE_UTIL_TX_BYTES",
                     "NVML_PCIE_UTIL_RX_BYTES", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX",
                     "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", "NVML_ERROR_GPU_IS_LOST",
                     "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", "NVML_FI_DEV_PCIE_COUNT_RX_BYTES"):
        assert getattr(fake, constant) == getattr(pynvml, constant), constant
    for structure in ("c_nvmlFieldValue_t", "c_nvmlUtilization_t", "c_nvmlMemory_t"):
        assert getattr(fake, structure) is getattr(pynvml, structure), structure


def test_a_driver_without_the_pcie_fields_drops_them_without_counting_errors() -> None:
    clock = FakeClock(1000.0)
    nvml = FakeNvml([FakeGpu(pcie_fields_unknown=True, nvlink_tx_kib=1)])
    poller = make_poller(nvml, clock)
    for _ in range(3):
        clock.now += 1.0
        snap = poller.poll()
    assert snap.get(mn.GPU_NVLINK_TX, ("0",)) == 1024
    assert mn.GPU_PCIE_TX not in snap.points
    assert snap.get(mn.AGENT_SCRAPE_ERRORS, ("nvml:gpu0",)) is None


def test_a_failing_field_read_is_counted_and_the_next_reading_catches_up() -> None:
    clock = FakeClock(1000.0)
    gpus = [FakeGpu(nvlink_tx_kib=100, pcie_tx_bytes=1_000)]
    poller = make_poller(FakeNvml(gpus), clock)
    poller.poll()
    clock.now += 1.0
    gpus[0].field_error = NVML_ERROR_GPU_IS_LOST
    gpus[0].nvlink_tx_kib += 10
    gpus[0].pcie_tx_bytes += 3_000
    failed = poller.poll()
    assert failed.get(mn.AGENT_SCRAPE_ERRORS, ("nvml:gpu0",)) == 1.0
    assert mn.GPU_NVLINK_TX not in failed.points and mn.GPU_PCIE_TX not in failed.points
    assert failed.get(mn.GPU_UTILIZATION, ("0",)) == 0.5  # the other readings still taken
    clock.now += 1.0
    gpus[0].field_error = 0
    gpus[0].nvlink_tx_kib += 10
    gpus[0].pcie_tx_bytes += 1_000
    recovered = poller.poll()
    assert recovered.get(mn.GPU_NVLINK_TX, ("0",)) == 120 * 1024
    # The rate spans both intervals since the last good reading: 4,000 bytes in 2 s.
    assert recovered.get(mn.GPU_PCIE_TX, ("0",)) == pytest.approx(2_000)
    assert recovered.get(mn.AGENT_SCRAPE_ERRORS, ("nvml:gpu0",)) == 1.0


def test_a_pair_dropped_later_keeps_the_other_pairs_history() -> None:
    clock = FakeClock(1000.0)
    gpus = [FakeGpu(nvlink_tx_kib=1_000, pcie_tx_bytes=5_000)]
    poller = make_poller(FakeNvml(gpus), clock)
    poller.poll()
    gpus[0].reset()  # NVLink counters restart: 1,000 KiB kept as an offset
    gpus[0].nvlink_tx_kib = 10
    clock.now += 1.0
    poller.poll()
    # The driver stops answering the PCIe fields (as an older one would after an
    # update was rolled back); the NVLink pair keeps its offset.
    gpus[0].pcie_fields_unknown = True
    gpus[0].nvlink_tx_kib = 30
    clock.now += 1.0
    snap = poller.poll()
    assert snap.get(mn.GPU_NVLINK_TX, ("0",)) == 1_030 * 1024
    assert mn.GPU_PCIE_TX not in snap.points
    assert snap.get(mn.AGENT_SCRAPE_ERRORS, ("nvml:gpu0",)) is None


def test_a_pair_that_keeps_failing_does_not_hide_the_other_pair() -> None:
    # PCIe fields answering an error on every poll (as a locked-down vGPU might): the
    # NVLink pair is still read, and each poll counts one error.
    clock = FakeClock(1000.0)
    gpus = [FakeGpu(nvlink_tx_kib=1, pcie_field_error=NVML_ERROR_NO_PERMISSION)]
    poller = make_poller(FakeNvml(gpus), clock)
    for poll in range(1, 4):
        gpus[0].nvlink_tx_kib = poll * 10
        snap = poller.poll()
        clock.now += 1.0
        assert snap.get(mn.GPU_NVLINK_TX, ("0",)) == poll * 10 * 1024
        assert mn.GPU_PCIE_TX not in snap.points
        assert snap.get(mn.AGENT_SCRAPE_ERRORS, ("nvml:gpu0",)) == poll
    # The PCIe fields recover: a rate from the second good reading on.
    gpus[0].pcie_field_error = 0
    gpus[0].pcie_tx_bytes = 5_000
    assert poller.poll().get(mn.GPU_PCIE_TX, ("0",)) is None
    clock.now += 1.0
    gpus[0].pcie_tx_bytes = 8_000
    snap = poller.poll()
    assert snap.get(mn.GPU_PCIE_TX, ("0",)) == pytest.approx(3_000)
    assert snap.get(mn.GPU_NVLINK_TX, ("0",)) == 30 * 1024
    assert snap.get(mn.AGENT_SCRAPE_ERRORS, ("nvml:gpu0",)) == 3


def test_nvlink_dropped_later_leaves_the_pcie_rate_continuous() -> None:
    clock = FakeClock(1000.0)
    gpus = [FakeGpu(nvlink_tx_kib=5, pcie_tx_bytes=1_000)]
    poller = make_poller(FakeNvml(gpus), clock)
    poller.poll()
    clock.now += 1.0
    gpus[0].has_nvlink = False  # the NVLink fields now answer NOT_SUPPORTED
    gpus[0].pcie_tx_bytes = 3_000
    snap = poller.poll()
    assert snap.get(mn.GPU_PCIE_TX, ("0",)) == pytest.approx(2_000)
    assert mn.GPU_NVLINK_TX not in snap.points
    clock.now += 1.0
    gpus[0].pcie_tx_bytes = 3_500
    assert poller.poll().get(mn.GPU_PCIE_TX, ("0",)) == pytest.approx(500)


def test_a_gpu_without_either_pair_stops_asking_for_field_values() -> None:
    nvml = FakeNvml([FakeGpu(has_nvlink=False, has_pcie_counters=False)])
    poller = make_poller(nvml, FakeClock(1000.0))
    for _ in range(3):
        snap = poller.poll()
    assert nvml.calls["nvmlDeviceGetFieldValues"] == 1
    assert mn.GPU_NVLINK_TX not in snap.points and mn.GPU_PCIE_TX not in snap.points
    assert snap.get(mn.GPU_UTILIZATION, ("0",)) == 0.5
    assert snap.get(mn.AGENT_SCRAPE_ERRORS, ("nvml:gpu0",)) is None


class _OldPynvml(FakeNvml):
    """nvidia-ml-py before 12.555: no PCIe counter field constants."""

    def __getattribute__(self, name: str) -> object:
        if name.startswith("NVML_FI_DEV_PCIE_COUNT_"):
            raise AttributeError(name)
        return super().__getattribute__(name)


def test_an_older_pynvml_without_the_pcie_field_constants_still_reads_them() -> None:
    clock = FakeClock(1000.0)
    gpus = [FakeGpu()]
    poller = make_poller(_OldPynvml(gpus), clock)
    poller.poll()
    clock.now += 1.0
    gpus[0].pcie_tx_bytes += 1_000
    snap = poller.poll()
    assert snap.get(mn.AGENT_NVML_UP) == 1.0
    assert snap.get(mn.GPU_PCIE_TX, ("0",)) == pytest.approx(1_000)


def test_a_pcie_rate_is_not_averaged_over_a_long_gap() -> None:
    clock = FakeClock(1000.0)
    gpus = [FakeGpu()]
    poller = make_poller(FakeNvml(gpus), clock)
    poller.poll()
    clock.now += 600.0  # the agent stalled or the GPU was unreadable
    gpus[0].pcie_tx_bytes += 6_000_000
    assert poller.poll().get(mn.GPU_PCIE_TX, ("0",)) is None
    clock.now += 1.0
    gpus[0].pcie_tx_bytes += 5_000
    assert poller.poll().get(mn.GPU_PCIE_TX, ("0",)) == pytest.approx(5_000)


def test_gpus_past_max_devices_add_up_under_other() -> None:
    nvml = FakeNvml([FakeGpu(memory_used_bytes=2**30) for _ in range(4)])
    sampler = NvmlSampler(nvml, FakeClock(1000.0))
    sampler.start()
    poller = NodePoller(nvml_sampler=sampler, nic_sampler=NicSampler(
        source="sysfs", sysfs_root="/nonexistent-sysfs"),  # type: ignore[arg-type]
        engine_scraper=None, clock=FakeClock(1000.0), wall_clock_ns=lambda: 1,
        max_devices=2, max_sources=4)
    snap = poller.poll()
    used = snap.points[mn.GPU_MEMORY_USED]
    assert used[("0",)] == used[("1",)] == 2**30
    assert used[(mn.OTHER_LABEL_VALUE,)] == 2 * 2**30  # GPUs 2 and 3


def test_a_gpu_without_utilization_keeps_its_other_readings_without_errors() -> None:
    # MIG mode: the utilization query answers NOT_SUPPORTED on every poll.
    clock = FakeClock(1000.0)
    nvml = FakeNvml([FakeGpu(has_utilization=False, nvlink_tx_kib=5)])
    poller = make_poller(nvml, clock)
    for _ in range(3):
        clock.now += 1.0
        snap = poller.poll()
    assert snap.get(mn.GPU_MEMORY_USED, ("0",)) == 40 * 2**30
    assert snap.get(mn.GPU_POWER, ("0",)) == pytest.approx(350.0)
    assert snap.get(mn.GPU_NVLINK_TX, ("0",)) == 5 * 1024
    assert snap.get(mn.GPU_UTILIZATION, ("0",)) is None
    assert snap.get(mn.GPU_MEMORY_BW_UTIL, ("0",)) is None
    assert snap.get(mn.GPU_BUSY_SECONDS, ("0",)) is None  # never measured, not 0
    assert snap.get(mn.AGENT_SCRAPE_ERRORS, ("nvml:gpu0",)) is None
    # Asked once, then skipped; the handle was never thrown away.
    assert nvml.calls["nvmlDeviceGetUtilizationRates"] == 1
    assert nvml.calls["nvmlDeviceGetHandleByIndex"] == 1


def test_a_failing_utilization_reading_is_counted_and_keeps_the_row() -> None:
    clock = FakeClock(1000.0)
    gpus = [FakeGpu(utilization_percent=50)]
    nvml = FakeNvml(gpus)
    poller = make_poller(nvml, clock)
    poller.poll()
    clock.now += 1.0
    gpus[0].utilization_error = NVML_ERROR_NO_PERMISSION
    failed = poller.poll()
    assert failed.get(mn.AGENT_SCRAPE_ERRORS, ("nvml:gpu0",)) == 1.0
    assert failed.get(mn.GPU_UTILIZATION, ("0",)) is None
    assert failed.get(mn.GPU_MEMORY_USED, ("0",)) == 40 * 2**30
    assert failed.get(mn.GPU_BUSY_SECONDS, ("0",)) == 0.0  # stands still
    clock.now += 1.0
    gpus[0].utilization_error = 0
    recovered = poller.poll()
    assert recovered.get(mn.GPU_UTILIZATION, ("0",)) == pytest.approx(0.5)
    # Still asked after a failure that is not NOT_SUPPORTED; the gap is integrated.
    assert nvml.calls["nvmlDeviceGetUtilizationRates"] == 3
    assert recovered.get(mn.GPU_BUSY_SECONDS, ("0",)) == pytest.approx(1.0)


def folded_poller(nvml: FakeNvml, clock: FakeClock) -> NodePoller:
    """max_devices 1: GPU 0 keeps its label, the others share "other"."""
    sampler = NvmlSampler(nvml, clock)
    sampler.start()
    return NodePoller(nvml_sampler=sampler, nic_sampler=NicSampler(
        source="sysfs", sysfs_root="/nonexistent-sysfs"),  # type: ignore[arg-type]
        engine_scraper=None, clock=clock, wall_clock_ns=lambda: 1,
        max_devices=1, max_sources=8)


FOLDED_COUNTERS = (mn.GPU_NVLINK_TX, mn.GPU_NVLINK_RX, mn.GPU_BUSY_SECONDS)
OTHER = (mn.OTHER_LABEL_VALUE,)


def poll_folded(poller: NodePoller, clock: FakeClock, gpus: list[FakeGpu]) -> list[float]:
    clock.now += 1.0
    for gpu in gpus:
        gpu.nvlink_tx_kib += 10
        gpu.nvlink_rx_kib += 20
    snap = poller.poll()
    values = [snap.get(spec, OTHER) for spec in FOLDED_COUNTERS]
    assert None not in values
    return values  # type: ignore[return-value]


def assert_never_backwards(history: list[list[float]]) -> None:
    for before, after in itertools.pairwise(history):
        for spec, old, new in zip(FOLDED_COUNTERS, before, after, strict=True):
            assert new >= old, (spec.name, history)


@pytest.mark.parametrize("break_gpu", ["failing", "field_error", "gone"])
def test_other_never_goes_backwards_when_a_folded_gpu_misses_a_poll(break_gpu: str) -> None:
    clock = FakeClock(1000.0)
    gpus = [FakeGpu(nvlink_tx_kib=1000 * (i + 1), nvlink_rx_kib=500) for i in range(3)]
    nvml = FakeNvml(gpus)
    poller = folded_poller(nvml, clock)
    history = [poll_folded(poller, clock, gpus) for _ in range(2)]
    if break_gpu == "failing":
        gpus[2].failing = True
    elif break_gpu == "field_error":
        gpus[2].field_error = NVML_ERROR_GPU_IS_LOST
    else:
        nvml.gpus = gpus[:2]
    history += [poll_folded(poller, clock, gpus) for _ in range(2)]
    # While GPU 2 misses, "other" is GPU 1's reading plus GPU 2's last one.
    assert history[-1][0] == (gpus[1].nvlink_tx_kib + 3000 + 20) * 1024
    gpus[2].failing = False
    gpus[2].field_error = 0
    nvml.gpus = gpus
    history += [poll_folded(poller, clock, gpus) for _ in range(2)]
    assert_never_backwards(history)
    # Back: GPU 2's counter caught up with what it counted meanwhile.
    assert history[-1][0] == (gpus[1].nvlink_tx_kib + gpus[2].nvlink_tx_kib) * 1024


def test_other_never_goes_backwards_when_a_folded_gpu_loses_utilization() -> None:
    clock = FakeClock(1000.0)
    gpus = [FakeGpu() for _ in range(3)]
    poller = folded_poller(FakeNvml(gpus), clock)
    history = [poll_folded(poller, clock, gpus) for _ in range(3)]
    gpus[2].has_utilization = False  # MIG enabled at run time
    history += [poll_folded(poller, clock, gpus) for _ in range(2)]
    assert_never_backwards(history)
    assert history[-1][2] > history[-2][2]  # GPU 1 still adds busy time


def test_energy_is_nvmls_total_energy_counter_in_joules() -> None:
    clock = FakeClock(1000.0)
    gpus = [FakeGpu(energy_millijoules=5_000_000)]
    poller = make_poller(FakeNvml(gpus), clock)
    assert poller.poll().get(mn.GPU_ENERGY, ("0",)) == pytest.approx(5_000.0)
    gpus[0].energy_millijoules += 700_000  # 700 J in a second: a GPU at 700 W
    clock.now += 1.0
    assert poller.poll().get(mn.GPU_ENERGY, ("0",)) == pytest.approx(5_700.0)


def test_without_the_counter_energy_is_power_integrated_over_time() -> None:
    clock = FakeClock(1000.0)
    gpus = [FakeGpu(has_energy=False, power_milliwatts=350_000)]
    nvml = FakeNvml(gpus)
    poller = make_poller(nvml, clock)
    assert poller.poll().get(mn.GPU_ENERGY, ("0",)) == 0.0
    clock.now += 2.0
    assert poller.poll().get(mn.GPU_ENERGY, ("0",)) == pytest.approx(700.0)  # 350 W x 2 s
    clock.now += 3600.0  # a stall is not guessed
    assert poller.poll().get(mn.GPU_ENERGY, ("0",)) == pytest.approx(700.0)
    assert nvml.calls["nvmlDeviceGetTotalEnergyConsumption"] == 1  # asked once
