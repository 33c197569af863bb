"""GPU series through NVML (nvidia-ml-py, imported as ``pynvml``), cheap calls only.

Per GPU and poll: utilization rates (SM and memory-bandwidth busy share), memory info,
power, SM clock, NVLink data throughput counters (one ``nvmlDeviceGetFieldValues`` call,
summed over links) and PCIe throughput. No process lists, no nvidia-smi.

The sampler writes each reading straight into the poll's series (:class:`GpuSeries`) and
keeps what one GPU needs between polls (:class:`_Gpu`): its handle, the optional
readings it still asks for, its NVLink totals (monotonic across device resets) and its
integrated busy seconds. This runs every second forever, so the per-GPU work is a few
attribute reads and dict writes around each NVML call (measured against the raw calls in
``bench/agent_bench.py``).

The NVML module is injected (``nvml=``), so tests pass a fake shaped like ``pynvml``. With
no module, no driver or no GPU, :attr:`NvmlSampler.up` is ``False`` and :meth:`read`
adds nothing; initialisation is retried every ``retry_seconds``. A call a device does
not support is skipped from then on without counting an error; any other failure is
counted against that GPU (``nvml:gpu<N>``) and never stops the other GPUs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from tokenpath import metric_names as mn
from tokenpath.agent.monotonic import MonotonicTotal
from tokenpath.agent.snapshot import ErrorCounts, LabelValues

logger = logging.getLogger(__name__)

NVML_RETRY_SECONDS = 60.0
KIB = 1024.0
PERCENT = 100.0
MILLIWATTS_PER_WATT = 1000.0
HERTZ_PER_MHZ = 1_000_000.0
# NVML's aggregate scope for NVLink throughput fields: summed over all links.
NVLINK_ALL_LINKS_SCOPE = 0xFFFFFFFF
NVML_SUCCESS = 0
# Longest gap over which a utilization reading is integrated into busy seconds: after a
# GPU was unreadable for longer, the gap is not guessed.
MAX_BUSY_INTEGRATION_GAP_SECONDS = 10.0

Series = dict[LabelValues, float]


class GpuSeries:
    """One poll of every readable GPU: per metric, ``(gpu,)`` label values -> value.
    NVLink and busy values are already cumulative and monotonic."""

    __slots__ = ("busy_seconds", "memory_bandwidth", "memory_total", "memory_used",
                 "nvlink_rx", "nvlink_tx", "pcie_rx", "pcie_tx", "power", "sm_clock",
                 "utilization")

    def __init__(self) -> None:
        self.utilization: Series = {}
        self.memory_bandwidth: Series = {}
        self.memory_used: Series = {}
        self.memory_total: Series = {}
        self.busy_seconds: Series = {}
        self.power: Series = {}
        self.sm_clock: Series = {}
        self.pcie_tx: Series = {}
        self.pcie_rx: Series = {}
        self.nvlink_tx: Series = {}
        self.nvlink_rx: Series = {}

    def add_to(self, points: dict[mn.MetricSpec, Series]) -> None:
        """Puts the series into a snapshot's points (optional metrics only when read)."""
        if not self.utilization:
            return
        points[mn.GPU_UTILIZATION] = self.utilization
        points[mn.GPU_MEMORY_BW_UTIL] = self.memory_bandwidth
        points[mn.GPU_MEMORY_USED] = self.memory_used
        points[mn.GPU_MEMORY_TOTAL] = self.memory_total
        points[mn.GPU_BUSY_SECONDS] = self.busy_seconds
        if self.power:
            points[mn.GPU_POWER] = self.power
        if self.sm_clock:
            points[mn.GPU_SM_CLOCK] = self.sm_clock
        if self.pcie_tx:
            points[mn.GPU_PCIE_TX] = self.pcie_tx
            points[mn.GPU_PCIE_RX] = self.pcie_rx
        if self.nvlink_tx:
            points[mn.GPU_NVLINK_TX] = self.nvlink_tx
            points[mn.GPU_NVLINK_RX] = self.nvlink_rx


class _Gpu:
    """What the sampler keeps for one GPU index between polls."""

    __slots__ = ("ask_nvlink", "ask_pcie", "ask_power", "ask_sm_clock", "busy_seconds",
                 "error_source", "handle", "index", "labels", "last_seen", "nvlink_rx",
                 "nvlink_tx")

    def __init__(self, index: int, labels: LabelValues, ask_pcie: bool) -> None:
        self.index = index
        self.labels = labels
        self.error_source = f"nvml:gpu{index}"
        # None until looked up, and again after a failure (stale after a reset).
        self.handle: Any = None
        # Optional readings, asked for until the device answers NOT_SUPPORTED.
        self.ask_power = True
        self.ask_sm_clock = True
        self.ask_nvlink = True
        self.ask_pcie = ask_pcie
        self.nvlink_tx = MonotonicTotal()
        self.nvlink_rx = MonotonicTotal()
        self.busy_seconds = 0.0
        self.last_seen: float | None = None


class NvmlSampler:
    """Reads every GPU NVML can see; one failing GPU never fails the others."""

    def __init__(
        self,
        nvml: Any | None,
        clock: Callable[[], float],
        *,
        retry_seconds: float = NVML_RETRY_SECONDS,
        pcie_throughput: bool = True,
    ) -> None:
        self._nvml: Any = nvml
        self._clock = clock
        self._retry_seconds = retry_seconds
        self._pcie_throughput = pcie_throughput
        self._initialized = False
        self._last_init_attempt: float | None = None
        self._gpus: list[_Gpu] = []  # by NVML index
        self._nvlink_fields: list[tuple[int, int]] = []
        self._last_count = -1
        self._not_supported = -1
        self._clock_sm = self._pcie_tx = self._pcie_rx = -1
        self.init_error: str | None = None

    @property
    def up(self) -> bool:
        return self._initialized

    def start(self) -> None:
        self._try_init()

    def _try_init(self) -> None:
        self._last_init_attempt = self._clock()
        nvml = self._nvml
        if nvml is None:
            self.init_error = "nvidia-ml-py (pynvml) is not installed"
            return
        try:
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self.init_error = f"{type(exc).__name__}: {exc}"
            logger.info("NVML unavailable (%s); GPU metrics off, nvml_up 0", self.init_error)
            return
        self._initialized = True
        self.init_error = None
        self._not_supported = int(nvml.NVML_ERROR_NOT_SUPPORTED)
        self._clock_sm = int(nvml.NVML_CLOCK_SM)
        self._pcie_tx = int(nvml.NVML_PCIE_UTIL_TX_BYTES)
        self._pcie_rx = int(nvml.NVML_PCIE_UTIL_RX_BYTES)
        self._nvlink_fields = [
            (int(nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX), NVLINK_ALL_LINKS_SCOPE),
            (int(nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX), NVLINK_ALL_LINKS_SCOPE),
        ]

    def read(self, errors: ErrorCounts, gpu_label: Callable[[str], str]) -> GpuSeries:
        """Every readable GPU's series; failures are counted in ``errors``. ``gpu_label``
        bounds the ``gpu`` label (called once per GPU index)."""
        series = GpuSeries()
        if not self._initialized:
            last = self._last_init_attempt
            if last is None or self._clock() - last >= self._retry_seconds:
                self._try_init()
            if not self._initialized:
                return series
        try:
            count = int(self._nvml.nvmlDeviceGetCount())
        except Exception:
            errors.count("nvml")
            return series
        gpus = self._gpus
        while len(gpus) < count:
            index = len(gpus)
            gpus.append(_Gpu(index, (gpu_label(str(index)),), self._pcie_throughput))
        if count != self._last_count:  # GPUs went away: forget their handles
            self._last_count = count
            for gone in gpus[count:]:
                gone.handle = None
        now = self._clock()
        for index in range(count):
            gpu = gpus[index]
            if not self._read_gpu(gpu, series, now):
                errors.count(gpu.error_source)
        return series

    def _read_gpu(self, gpu: _Gpu, series: GpuSeries, now: float) -> bool:
        """Writes one GPU's readings into ``series``; False when any of them failed."""
        nvml = self._nvml
        try:
            handle = gpu.handle
            if handle is None:
                gpu.handle = handle = nvml.nvmlDeviceGetHandleByIndex(gpu.index)
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        except Exception:
            gpu.handle = None  # may be stale after a reset: look it up again next poll
            return False
        labels = gpu.labels
        utilization = rates.gpu / PERCENT
        series.utilization[labels] = utilization
        series.memory_bandwidth[labels] = rates.memory / PERCENT
        series.memory_used[labels] = float(memory.used)
        series.memory_total[labels] = float(memory.total)
        last_seen = gpu.last_seen
        if last_seen is not None and 0 < now - last_seen <= MAX_BUSY_INTEGRATION_GAP_SECONDS:
            gpu.busy_seconds += utilization * (now - last_seen)
        gpu.last_seen = now
        series.busy_seconds[labels] = gpu.busy_seconds
        # Optional readings: each skipped once NOT_SUPPORTED; any other failure fails this
        # GPU's poll (counted once) and the remaining readings are still taken.
        ok = True
        if gpu.ask_power:
            try:
                series.power[labels] = (nvml.nvmlDeviceGetPowerUsage(handle)
                                        / MILLIWATTS_PER_WATT)
            except Exception as exc:
                if self._is_not_supported(exc):
                    gpu.ask_power = False
                else:
                    ok = False
        if gpu.ask_sm_clock:
            try:
                series.sm_clock[labels] = (nvml.nvmlDeviceGetClockInfo(handle, self._clock_sm)
                                           * HERTZ_PER_MHZ)
            except Exception as exc:
                if self._is_not_supported(exc):
                    gpu.ask_sm_clock = False
                else:
                    ok = False
        if gpu.ask_nvlink:
            try:
                values = nvml.nvmlDeviceGetFieldValues(handle, self._nvlink_fields)
                tx, rx = values[0], values[1]
                if tx.nvmlReturn == NVML_SUCCESS and rx.nvmlReturn == NVML_SUCCESS:
                    series.nvlink_tx[labels] = gpu.nvlink_tx.update(tx.value.ullVal * KIB)
                    series.nvlink_rx[labels] = gpu.nvlink_rx.update(rx.value.ullVal * KIB)
                elif self._not_supported in (tx.nvmlReturn, rx.nvmlReturn):
                    gpu.ask_nvlink = False
                else:
                    ok = False
            except Exception as exc:
                if self._is_not_supported(exc):
                    gpu.ask_nvlink = False
                else:
                    ok = False
        if gpu.ask_pcie:
            try:
                tx_kb = nvml.nvmlDeviceGetPcieThroughput(handle, self._pcie_tx)
                rx_kb = nvml.nvmlDeviceGetPcieThroughput(handle, self._pcie_rx)
                series.pcie_tx[labels] = tx_kb * KIB
                series.pcie_rx[labels] = rx_kb * KIB
            except Exception as exc:
                if self._is_not_supported(exc):
                    gpu.ask_pcie = False
                else:
                    ok = False
        return ok

    def _is_not_supported(self, exc: Exception) -> bool:
        return getattr(exc, "value", None) == self._not_supported

    def device_names(self) -> dict[int, str]:
        """GPU names for ``--once`` output (not used in the polling loop)."""
        names: dict[int, str] = {}
        for gpu in self._gpus:
            if gpu.handle is None:
                continue
            try:
                name = self._nvml.nvmlDeviceGetName(gpu.handle)
            except Exception:
                continue
            names[gpu.index] = name.decode() if isinstance(name, bytes) else str(name)
        return names

    def shutdown(self) -> None:
        if self._initialized:
            self._initialized = False
            for gpu in self._gpus:
                gpu.handle = None
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                logger.debug("nvmlShutdown failed", exc_info=True)
