"""GPU readings through NVML (nvidia-ml-py, imported as ``pynvml``), cheap calls only.

Per GPU and poll: utilization rates (SM and memory-bandwidth busy share), memory info,
power, SM clock, NVLink data throughput counters (one ``nvmlDeviceGetFieldValues`` call,
summed over links) and PCIe throughput. No process lists, no nvidia-smi.

The NVML module is injected (``nvml=``), so tests pass a fake shaped like ``pynvml``. With
no module, no driver or no GPU, :attr:`NvmlSampler.up` is ``False`` and :meth:`read`
returns nothing; initialisation is retried every ``retry_seconds``. A call a device does
not support is skipped from then on without counting an error; any other failure is
counted against that GPU (``nvml:gpu<N>``) and never stops the other GPUs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokenpath.agent.snapshot import ErrorCounts

logger = logging.getLogger(__name__)

NVML_RETRY_SECONDS = 60.0
KIB = 1024.0
PERCENT = 100.0
MILLIWATTS_PER_WATT = 1000.0
HERTZ_PER_MHZ = 1_000_000.0
# NVML's aggregate scope for NVLink throughput fields: summed over all links.
NVLINK_ALL_LINKS_SCOPE = 0xFFFFFFFF
NVML_SUCCESS = 0

# Optional readings: a device that answers NOT_SUPPORTED is not asked again.
OPT_POWER = "power"
OPT_SM_CLOCK = "sm_clock"
OPT_NVLINK = "nvlink"
OPT_PCIE = "pcie"


@dataclass(slots=True)
class GpuReading:
    """One GPU at one poll. NVLink values are NVML's raw cumulative bytes (they drop to
    zero on a device reset; the poller makes them monotonic)."""

    index: int
    utilization_ratio: float
    memory_bandwidth_ratio: float
    memory_used_bytes: float
    memory_total_bytes: float
    power_watts: float | None = None
    sm_clock_hertz: float | None = None
    nvlink_tx_bytes: float | None = None
    nvlink_rx_bytes: float | None = None
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


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
        self._handles: dict[int, Any] = {}
        self._unsupported: dict[int, set[str]] = {}
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

    def read(self, errors: ErrorCounts) -> list[GpuReading]:
        """Every GPU's reading; failures are counted in ``errors``."""
        if not self._initialized:
            last = self._last_init_attempt
            if last is None or self._clock() - last >= self._retry_seconds:
                self._try_init()
            if not self._initialized:
                return []
        nvml = self._nvml
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception:
            errors.count("nvml")
            return []
        readings: list[GpuReading] = []
        for index in range(count):
            reading = self._read_gpu(index, errors)
            if reading is not None:
                readings.append(reading)
        if count != self._last_count:  # GPUs went away: forget their handles
            self._last_count = count
            for stale in [i for i in self._handles if i >= count]:
                del self._handles[stale]
        return readings

    def _read_gpu(self, index: int, errors: ErrorCounts) -> GpuReading | None:
        nvml = self._nvml
        try:
            handle = self._handles.get(index)
            if handle is None:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                self._handles[index] = handle
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        except Exception:
            # The handle may be stale after a reset: look it up again next poll.
            self._handles.pop(index, None)
            errors.count(f"nvml:gpu{index}")
            return None
        reading = GpuReading(index, rates.gpu / PERCENT, rates.memory / PERCENT,
                             float(memory.used), float(memory.total))
        unsupported = self._unsupported.get(index)
        if unsupported is None:
            self._unsupported[index] = unsupported = set()
        # Optional readings: each skipped once NOT_SUPPORTED; any other failure is
        # counted once for this GPU and the remaining readings are still taken.
        failed = False
        if OPT_POWER not in unsupported:
            try:
                reading.power_watts = nvml.nvmlDeviceGetPowerUsage(handle) / MILLIWATTS_PER_WATT
            except Exception as exc:
                failed |= self._note_failure(exc, OPT_POWER, unsupported)
        if OPT_SM_CLOCK not in unsupported:
            try:
                reading.sm_clock_hertz = (nvml.nvmlDeviceGetClockInfo(handle, self._clock_sm)
                                          * HERTZ_PER_MHZ)
            except Exception as exc:
                failed |= self._note_failure(exc, OPT_SM_CLOCK, unsupported)
        if OPT_NVLINK not in unsupported:
            try:
                tx, rx = nvml.nvmlDeviceGetFieldValues(handle, self._nvlink_fields)[:2]
                if tx.nvmlReturn == NVML_SUCCESS and rx.nvmlReturn == NVML_SUCCESS:
                    reading.nvlink_tx_bytes = tx.value.ullVal * KIB
                    reading.nvlink_rx_bytes = rx.value.ullVal * KIB
                elif self._not_supported in (tx.nvmlReturn, rx.nvmlReturn):
                    unsupported.add(OPT_NVLINK)
                else:
                    failed = True
            except Exception as exc:
                failed |= self._note_failure(exc, OPT_NVLINK, unsupported)
        if self._pcie_throughput and OPT_PCIE not in unsupported:
            try:
                tx_kb = nvml.nvmlDeviceGetPcieThroughput(handle, self._pcie_tx)
                rx_kb = nvml.nvmlDeviceGetPcieThroughput(handle, self._pcie_rx)
                reading.pcie_tx_bytes_per_second = tx_kb * KIB
                reading.pcie_rx_bytes_per_second = rx_kb * KIB
            except Exception as exc:
                failed |= self._note_failure(exc, OPT_PCIE, unsupported)
        if failed:
            errors.count(f"nvml:gpu{index}")
        return reading

    def _note_failure(self, exc: Exception, option: str, unsupported: set[str]) -> bool:
        """True when ``exc`` is a real failure; NOT_SUPPORTED only marks ``option``."""
        if getattr(exc, "value", None) == self._not_supported:
            unsupported.add(option)
            return False
        return True

    def device_names(self) -> dict[int, str]:
        """GPU names for ``--once`` output (not used in the polling loop)."""
        names: dict[int, str] = {}
        for index, handle in self._handles.items():
            try:
                name = self._nvml.nvmlDeviceGetName(handle)
            except Exception:
                continue
            names[index] = name.decode() if isinstance(name, bytes) else str(name)
        return names

    def shutdown(self) -> None:
        if self._initialized:
            self._initialized = False
            self._handles.clear()
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                logger.debug("nvmlShutdown failed", exc_info=True)
