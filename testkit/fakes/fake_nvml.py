"""A fake of the ``pynvml`` module (nvidia-ml-py) at the narrowest boundary the agent uses.

:class:`FakeNvml` is module-like: the agent calls ``nvml.nvmlInit()``,
``nvml.nvmlDeviceGetUtilizationRates(handle)`` and reads ``nvml.NVML_CLOCK_SM`` on it
exactly as on the real module, with the same argument lists and return types: pynvml's own
ctypes structures (``c_nvmlUtilization_t``, ``c_nvmlMemory_t``, arrays of
``c_nvmlFieldValue_t``) holding values in NVML's units (percent, bytes, milliwatts, MHz,
KiB for NVLink, bytes for the PCIe counters). Errors are ``NVMLError``
subclasses carrying ``.value`` like pynvml's. Each :class:`FakeGpu` can fail, lack NVLink,
lack power or utilization readings (NOT_SUPPORTED, as a MIG-enabled GPU answers for
utilization), fail its utilization reading alone, or be reset (NVLink counters back to
zero). ``calls`` counts every function called so tests can assert the agent never asks
for expensive data.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_FI_DEV_PCIE_COUNT_TX_BYTES = 197
NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 198
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class NVMLError_NotSupported(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_NOT_SUPPORTED)


class NVMLError_GpuIsLost(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_GPU_IS_LOST)


class NVMLError_LibraryNotFound(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_LIBRARY_NOT_FOUND)


class NVMLError_Uninitialized(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_UNINITIALIZED)


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    utilization_percent: int = 50
    memory_utilization_percent: int = 30
    memory_used_bytes: int = 40 * 2**30
    memory_total_bytes: int = 80 * 2**30
    power_milliwatts: int = 350_000
    sm_clock_mhz: int = 1980
    nvlink_tx_kib: int = 0
    nvlink_rx_kib: int = 0
    pcie_tx_bytes: int = 0
    pcie_rx_bytes: int = 0
    has_nvlink: bool = True
    has_pcie_counters: bool = True
    # A driver older than the PCIe counter fields answers INVALID_ARGUMENT for them.
    pcie_fields_unknown: bool = False
    # NVML's value type for the NVLink and PCIe counters (a 32-bit one wraps at 2**32).
    counter_value_type: int = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    has_power: bool = True
    # NVML's total energy since the driver loaded; has_energy False: NOT_SUPPORTED
    energy_millijoules: int = 0
    has_energy: bool = True
    # Set: the energy counter rises by the board power over this clock's seconds between
    # reads (a GPU drawing power_milliwatts), as a real one does.
    energy_clock: Callable[[], float] | None = None
    energy_read_at: float | None = None
    # False: the utilization query answers NOT_SUPPORTED (a GPU with MIG mode enabled).
    has_utilization: bool = True
    # A return code the utilization query fails with while set (0: none).
    utilization_error: int = 0
    failing: bool = False
    # A return code every field value answers while set (0: none), as a driver does for
    # a GPU that has fallen off the bus between two calls.
    field_error: int = 0
    # The same for the PCIe counter fields only (the NVLink ones still answer).
    pcie_field_error: int = 0

    def reset(self) -> None:
        """A device reset: NVML's cumulative NVLink counters restart from zero."""
        self.nvlink_tx_kib = 0
        self.nvlink_rx_kib = 0


@dataclass(frozen=True)
class FakeHandle:
    index: int


class FakeNvml:
    """Module-like stand-in for ``pynvml``."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVML_SUCCESS = NVML_SUCCESS
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_INVALID_ARGUMENT = NVML_ERROR_INVALID_ARGUMENT
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST
    NVML_CLOCK_GRAPHICS = NVML_CLOCK_GRAPHICS
    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVML_CLOCK_MEM = NVML_CLOCK_MEM
    NVML_PCIE_UTIL_TX_BYTES = NVML_PCIE_UTIL_TX_BYTES
    NVML_PCIE_UTIL_RX_BYTES = NVML_PCIE_UTIL_RX_BYTES
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
    NVML_FI_DEV_PCIE_COUNT_TX_BYTES = NVML_FI_DEV_PCIE_COUNT_TX_BYTES
    NVML_FI_DEV_PCIE_COUNT_RX_BYTES = NVML_FI_DEV_PCIE_COUNT_RX_BYTES
    c_nvmlFieldValue_t = pynvml.c_nvmlFieldValue_t
    c_nvmlUtilization_t = pynvml.c_nvmlUtilization_t
    c_nvmlMemory_t = pynvml.c_nvmlMemory_t

    def __init__(self, gpus: list[FakeGpu] | None = None, *, library_missing: bool = False):
        self.gpus = list(gpus) if gpus is not None else [FakeGpu()]
        self.library_missing = library_missing
        self.initialized = False
        self.calls: Counter[str] = Counter()

    # -- library -------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.library_missing:
            raise NVMLError_LibraryNotFound()
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.calls["nvmlShutdown"] += 1
        self._check_init()
        self.initialized = False

    def nvmlDeviceGetCount(self) -> int:
        self.calls["nvmlDeviceGetCount"] += 1
        self._check_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self.calls["nvmlDeviceGetHandleByIndex"] += 1
        self._check_init()
        if not 0 <= index < len(self.gpus):
            raise NVMLError(2)
        return FakeHandle(index)

    # -- per device ----------------------------------------------------------------------
    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        self.calls["nvmlDeviceGetName"] += 1
        return self._gpu(handle).name

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> Any:
        self.calls["nvmlDeviceGetUtilizationRates"] += 1
        gpu = self._gpu(handle)
        if not gpu.has_utilization:
            raise NVMLError_NotSupported()
        if gpu.utilization_error:
            raise NVMLError(gpu.utilization_error)
        return pynvml.c_nvmlUtilization_t(gpu=gpu.utilization_percent,
                                          memory=gpu.memory_utilization_percent)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: Any = None) -> Any:
        self.calls["nvmlDeviceGetMemoryInfo"] += 1
        gpu = self._gpu(handle)
        return pynvml.c_nvmlMemory_t(total=gpu.memory_total_bytes,
                                     free=gpu.memory_total_bytes - gpu.memory_used_bytes,
                                     used=gpu.memory_used_bytes)

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        self.calls["nvmlDeviceGetPowerUsage"] += 1
        gpu = self._gpu(handle)
        if not gpu.has_power:
            raise NVMLError_NotSupported()
        return gpu.power_milliwatts

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeHandle) -> int:
        self.calls["nvmlDeviceGetTotalEnergyConsumption"] += 1
        gpu = self._gpu(handle)
        if not gpu.has_energy:
            raise NVMLError_NotSupported()
        if gpu.energy_clock is not None:
            now = gpu.energy_clock()
            if gpu.energy_read_at is not None:
                gpu.energy_millijoules += round(gpu.power_milliwatts * (now - gpu.energy_read_at))
            gpu.energy_read_at = now
        return gpu.energy_millijoules

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, type: int) -> int:
        self.calls["nvmlDeviceGetClockInfo"] += 1
        gpu = self._gpu(handle)
        if type != NVML_CLOCK_SM:
            raise NVMLError_NotSupported()
        return gpu.sm_clock_mhz

    def nvmlDeviceGetPcieThroughput(self, device: FakeHandle, counter: int) -> int:
        """Blocks ~20 ms per call in real NVML; the agent must not call it."""
        self.calls["nvmlDeviceGetPcieThroughput"] += 1
        self._gpu(device)
        return 0

    def nvmlDeviceGetFieldValues(self, handle: FakeHandle, fieldIds: list[Any]) -> Any:
        self.calls["nvmlDeviceGetFieldValues"] += 1
        gpu = self._gpu(handle)
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        for value, entry in zip(values, fieldIds, strict=True):
            field_id, scope_id = entry if isinstance(entry, tuple) else (entry, 0)
            value.fieldId, value.scopeId = field_id, scope_id
            value.valueType = gpu.counter_value_type
            if field_id == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
                supported, raw = gpu.has_nvlink, gpu.nvlink_tx_kib
            elif field_id == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
                supported, raw = gpu.has_nvlink, gpu.nvlink_rx_kib
            elif field_id in (NVML_FI_DEV_PCIE_COUNT_TX_BYTES, NVML_FI_DEV_PCIE_COUNT_RX_BYTES) \
                    and gpu.pcie_fields_unknown:
                value.nvmlReturn = NVML_ERROR_INVALID_ARGUMENT
                continue
            elif field_id == NVML_FI_DEV_PCIE_COUNT_TX_BYTES:
                supported, raw = gpu.has_pcie_counters, gpu.pcie_tx_bytes
            elif field_id == NVML_FI_DEV_PCIE_COUNT_RX_BYTES:
                supported, raw = gpu.has_pcie_counters, gpu.pcie_rx_bytes
            else:
                supported, raw = False, 0
            pcie_field = field_id in (NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
                                      NVML_FI_DEV_PCIE_COUNT_RX_BYTES)
            if gpu.field_error or (pcie_field and gpu.pcie_field_error):
                value.nvmlReturn = gpu.field_error or gpu.pcie_field_error
            elif supported:
                value.nvmlReturn = NVML_SUCCESS
                value.value.ullVal = raw
            else:
                value.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[Any]:
        """Expensive in real NVML; the agent must never call it in its loop."""
        self.calls["nvmlDeviceGetComputeRunningProcesses"] += 1
        return []

    # -- helpers -------------------------------------------------------------------------
    def _check_init(self) -> None:
        if not self.initialized:
            raise NVMLError_Uninitialized()

    def _gpu(self, handle: FakeHandle) -> FakeGpu:
        self._check_init()
        gpu = self.gpus[handle.index]
        if gpu.failing:
            raise NVMLError_GpuIsLost()
        return gpu


# Functions the agent is allowed to call, for the signature check against real pynvml.
AGENT_NVML_FUNCTIONS = (
    "nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetName", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetPowerUsage", "nvmlDeviceGetClockInfo", "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetTotalEnergyConsumption",
)
