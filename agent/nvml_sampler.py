"""GPU series through NVML (nvidia-ml-py, imported as ``pynvml``), cheap calls only.

Per GPU and poll: memory info, utilization rates (SM and memory-bandwidth busy share),
power, SM clock, and one ``nvmlDeviceGetFieldValues`` call for the cumulative NVLink data
counters (summed over links) and PCIe byte counters. No process lists, no nvidia-smi, and
not ``nvmlDeviceGetPcieThroughput``: NVML documents it as sampling a byte counter over a
20 ms window, so two calls per GPU would block a poll of 8 GPUs for about 320 ms. The
PCIe throughput gauges are the PCIe byte counters' increase over the poll interval. Both
counters are kept monotonic: a decrease of a 32-bit (or 16-bit) field value is a wrap, of
a 64-bit one a device reset.

The field values come back as a ctypes array of pynvml's ``c_nvmlFieldValue_t``; they are
decoded with one ``struct`` unpack whose layout is taken from that ctypes type (field
offsets and size), instead of a ctypes attribute read per field.

The sampler records each GPU's readings of a poll as one row (:class:`GpuReadings`),
turned into per-metric series only when the poll's snapshot is first read (a scrape or
a push), and keeps what one GPU needs between polls (:class:`_Gpu`): its handle, the
optional readings it still asks for, one counter group over its field values, its
previous PCIe totals and its integrated busy seconds. This runs every second forever,
so the per-GPU work is a few local reads around each NVML call (measured against the raw
calls in ``bench/agent_bench.py``).

The NVML module is injected (``nvml=``), so tests pass a fake shaped like ``pynvml`` or
the real one over a fake driver library. With no module, no driver or no GPU,
:attr:`NvmlSampler.up` is ``False`` and :meth:`read` records nothing; initialisation is
retried every ``retry_seconds``. A call a device does not support is skipped from then on
without counting an error (utilization too: a MIG-enabled GPU answers NOT_SUPPORTED for
it); any other failure is counted against that GPU (``nvml:gpu<N>``) and never stops the
other GPUs. Only a failed memory reading (or handle lookup) drops the GPU's row.

GPUs past ``max_devices`` share the ``gpu="other"`` label and their values add up. For
those, the sampler keeps each GPU's last counter values and adds them again while the GPU
is unreadable, gone, or has stopped answering one of them, so ``other`` never goes
backwards (as the NIC path does for NICs).
"""

from __future__ import annotations

import ctypes
import logging
import struct
from collections.abc import Callable
from typing import Any

from tokenpath import metric_names as mn
from tokenpath.agent.monotonic import CounterGroup
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
# nvml.h field ids, for nvidia-ml-py releases before 12.555 that lack the constants.
NVML_FI_DEV_PCIE_COUNT_TX_BYTES = 197
NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 198
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_FUNCTION_NOT_FOUND = 13
MILLIJOULES_PER_JOULE = 1000.0
# The field pairs a request may hold, named as in the log line that drops one.
NVLINK = "NVLink"
PCIE = "PCIe"
# Longest gap over which a utilization reading is integrated into busy seconds, or a PCIe
# rate averaged: after a GPU was unreadable for longer, the gap is not guessed.
MAX_SAMPLE_GAP_SECONDS = 10.0

Series = dict[LabelValues, float]


# A GPU row: its label values, then one value per GPU_ROW_METRICS entry (None where the
# reading was not taken). NVLink and busy values are cumulative and monotonic.
GPU_ROW_METRICS: tuple[mn.MetricSpec, ...] = (
    mn.GPU_UTILIZATION, mn.GPU_MEMORY_BW_UTIL, mn.GPU_MEMORY_USED, mn.GPU_MEMORY_TOTAL,
    mn.GPU_BUSY_SECONDS, mn.GPU_POWER, mn.GPU_SM_CLOCK, mn.GPU_NVLINK_TX, mn.GPU_NVLINK_RX,
    mn.GPU_PCIE_TX, mn.GPU_PCIE_RX, mn.GPU_ENERGY,
)
GpuRow = tuple[Any, ...]
# Row positions of the counters, which a GPU folded into "other" keeps adding.
GPU_ROW_COUNTERS: tuple[int, ...] = tuple(
    1 + position for position, spec in enumerate(GPU_ROW_METRICS) if spec.type == "counter")


class GpuReadings:
    """One poll of every readable GPU, one row per GPU."""

    __slots__ = ("rows",)

    def __init__(self) -> None:
        self.rows: list[GpuRow] = []

    def add_to(self, points: dict[mn.MetricSpec, Series]) -> None:
        """Puts the rows into a snapshot's points as series (a metric only when some GPU
        has a value for it)."""
        if not self.rows:
            return
        columns = list(zip(*self.rows, strict=True))
        labels = columns[0]
        distinct = len(set(labels)) == len(labels)
        for spec, values in zip(GPU_ROW_METRICS, columns[1:], strict=True):
            if distinct and None not in values:
                points[spec] = dict(zip(labels, values, strict=True))
                continue
            # GPUs past max_devices share the "other" label: their values add up.
            series: Series = {}
            for label, value in zip(labels, values, strict=True):
                if value is not None:
                    series[label] = series.get(label, 0.0) + value
            if series:
                points[spec] = series


class _FieldRequest:
    """One ``nvmlDeviceGetFieldValues`` request: NVLink TX/RX data counters and/or PCIe
    TX/RX byte counters (``pairs``, in request order), and the unpacker that turns the
    returned array into ``(value type, return code, value, ...)`` per field in request
    order. ``pcie_at`` is the PCIe TX value's index among the values (-1: no PCIe)."""

    __slots__ = ("ids", "nvlink", "pairs", "pcie", "pcie_at", "unpack")

    def __init__(self, nvml: Any, *, nvlink: bool, pcie: bool) -> None:
        self.nvlink = nvlink
        self.pcie = pcie
        self.pairs = tuple(name for name, asked in ((NVLINK, nvlink), (PCIE, pcie)) if asked)
        self.pcie_at = 2 * self.pairs.index(PCIE) if pcie else -1
        self.ids: list[tuple[int, int]] = []
        if nvlink:
            self.ids += [(int(nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX), NVLINK_ALL_LINKS_SCOPE),
                         (int(nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX), NVLINK_ALL_LINKS_SCOPE)]
        if pcie:
            self.ids += [
                (int(getattr(nvml, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES",
                             NVML_FI_DEV_PCIE_COUNT_TX_BYTES)), 0),
                (int(getattr(nvml, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES",
                             NVML_FI_DEV_PCIE_COUNT_RX_BYTES)), 0),
            ]
        self.unpack = ctypes_unpacker(nvml.c_nvmlFieldValue_t, FIELD_VALUE_FIELDS,
                                      len(self.ids))


def ctypes_unpacker(ctype: Any, fields: tuple[tuple[str, str], ...],
                    count: int = 1) -> Callable[[Any], tuple[int, ...]]:
    """A ``struct`` unpacker that reads ``fields`` (name, struct code; in offset order)
    from a ``ctype`` instance, or from each entry of a ``ctype * count`` array, with
    offsets and size taken from the ctypes type itself.

    pynvml's structures override ``__getattribute__`` in Python, so each attribute read
    costs a Python call; one unpack reads them all in C."""
    size = ctypes.sizeof(ctype)
    parts: list[str] = []
    position = 0
    for name, code in fields:
        offset = getattr(ctype, name).offset
        if offset < position:
            raise ValueError(f"{ctype.__name__}.{name}: fields not in offset order")
        if offset > position:
            parts.append(f"{offset - position}x")
        parts.append(code)
        position = offset + struct.calcsize("=" + code)
    if size > position:
        parts.append(f"{size - position}x")
    return struct.Struct("=" + "".join(parts) * count).unpack_from


# What the sampler reads from pynvml's structures; a field value's union is zero-filled
# by pynvml, so reading it as unsigned 64-bit is right for 32-bit unsigned values too.
UTILIZATION_FIELDS = (("gpu", "I"), ("memory", "I"))
MEMORY_FIELDS = (("total", "Q"), ("used", "Q"))
FIELD_VALUE_FIELDS = (("valueType", "I"), ("nvmlReturn", "I"), ("value", "Q"))
# Counters NVML returns as 32- or 16-bit values wrap ("Value can be wrapped", nvml.h): a
# decrease is a wrap, counted modulo the width. 64-bit values never wrap in practice, so
# there a decrease is a device reset (counting restarted from zero).
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_SHORT = 6
COUNTER_WRAP = {NVML_VALUE_TYPE_UNSIGNED_INT: 2**32, NVML_VALUE_TYPE_UNSIGNED_SHORT: 2**16}


class _Gpu:
    """What the sampler keeps for one GPU index between polls."""

    __slots__ = ("ask_energy", "ask_power", "ask_sm_clock", "ask_utilization", "busy_seconds",
                 "counters", "energy_joules", "error_source", "fields", "folded", "handle",
                 "held", "index", "labels", "last_seen", "pcie_last", "pcie_time",
                 "power_seen")

    def __init__(self, index: int, labels: LabelValues, fields: _FieldRequest | None) -> None:
        self.index = index
        self.labels = labels
        self.error_source = f"nvml:gpu{index}"
        # None until looked up, and again after a failure (stale after a reset).
        self.handle: Any = None
        # Optional readings, asked for until the device answers NOT_SUPPORTED.
        self.ask_utilization = True
        self.ask_power = True
        self.ask_sm_clock = True
        # Folded into "other" (past max_devices): its last counter values (in
        # GPU_ROW_COUNTERS order; None before any) are added again while it misses them.
        self.folded = labels[0] == mn.OTHER_LABEL_VALUE
        self.held: tuple[Any, ...] = (None,) * len(GPU_ROW_COUNTERS)
        self.fields = fields
        # The field values' counters (NVLink in KiB, PCIe in bytes), in request order;
        # widths set from the first reading.
        self.counters = CounterGroup()
        # PCIe TX and RX totals at the previous reading and its clock, for the rates.
        self.pcie_last: tuple[float, float] | None = None
        self.pcie_time = 0.0
        self.busy_seconds = 0.0
        self.last_seen: float | None = None
        # NVML's total-energy counter (Volta and later), else power integrated over time
        self.ask_energy = True
        self.energy_joules = 0.0
        self.power_seen: float | None = None


def _hold_counters(gpu: _Gpu, rows: list[GpuRow], appended: bool) -> None:
    """For a GPU folded into "other": its row's missing counters (or, with no row this
    poll, a row of them alone) take its last values, so the summed series never goes
    backwards; counters it did read become its last values."""
    held = gpu.held
    if appended:
        row = list(rows[-1])
        for at, position in enumerate(GPU_ROW_COUNTERS):
            if row[position] is None:
                row[position] = held[at]
        rows[-1] = tuple(row)
        gpu.held = tuple(row[position] for position in GPU_ROW_COUNTERS)
    elif any(value is not None for value in held):
        row = [gpu.labels] + [None] * len(GPU_ROW_METRICS)
        for at, position in enumerate(GPU_ROW_COUNTERS):
            row[position] = held[at]
        rows.append(tuple(row))


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
        self._any_folded = False  # some GPU is past max_devices (labelled "other")
        # Field requests by (nvlink, pcie): a GPU drops what it does not support.
        self._requests: dict[tuple[bool, bool], _FieldRequest | None] = {}
        self._last_count = -1
        self._not_supported = -1
        self._field_unavailable: tuple[int, ...] = ()
        self._clock_sm = -1
        self._unpack_utilization: Callable[[Any], tuple[int, ...]] = tuple
        self._unpack_memory: Callable[[Any], tuple[int, ...]] = tuple
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
        try:
            self._not_supported = int(nvml.NVML_ERROR_NOT_SUPPORTED)
            # Per-field answers that mean "this driver has no such field": the pair is
            # dropped rather than counted as an error every poll.
            self._field_unavailable = (self._not_supported, int(getattr(
                nvml, "NVML_ERROR_INVALID_ARGUMENT", NVML_ERROR_INVALID_ARGUMENT)))
            self._clock_sm = int(nvml.NVML_CLOCK_SM)
            self._unpack_utilization = ctypes_unpacker(nvml.c_nvmlUtilization_t,
                                                       UTILIZATION_FIELDS)
            self._unpack_memory = ctypes_unpacker(nvml.c_nvmlMemory_t, MEMORY_FIELDS)
            requests: dict[tuple[bool, bool], _FieldRequest | None] = {
                (nvlink, pcie): _FieldRequest(nvml, nvlink=nvlink, pcie=pcie)
                for nvlink in (True, False) for pcie in (True, False) if nvlink or pcie
            }
        except Exception as exc:  # a pynvml without what the sampler needs
            self.init_error = f"unsupported nvidia-ml-py: {type(exc).__name__}: {exc}"
            logger.warning("NVML set-up failed (%s); GPU metrics off", self.init_error)
            return
        requests[(False, False)] = None
        self._requests = requests
        self.init_error = None
        self._initialized = True

    def _request(self, *, nvlink: bool, pcie: bool) -> _FieldRequest | None:
        return self._requests[(nvlink, pcie)]

    def read(self, errors: ErrorCounts, gpu_label: Callable[[str], str]) -> GpuReadings:
        """Every readable GPU's readings; failures are counted in ``errors``. ``gpu_label``
        bounds the ``gpu`` label (called once per GPU index)."""
        series = GpuReadings()
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
            gpu = _Gpu(index, (gpu_label(str(index)),),
                       self._request(nvlink=True, pcie=self._pcie_throughput))
            gpus.append(gpu)
            self._any_folded = self._any_folded or gpu.folded
        if count != self._last_count:  # GPUs went away: forget their handles
            self._last_count = count
            for gone in gpus[count:]:
                gone.handle = None
        now = self._clock()
        rows = series.rows
        if not self._any_folded:  # the common case: every GPU has its own label
            for index in range(count):
                gpu = gpus[index]
                if not self._read_gpu(gpu, rows, now):
                    errors.count(gpu.error_source)
            return series
        for index in range(count):
            gpu = gpus[index]
            before = len(rows)
            if not self._read_gpu(gpu, rows, now):
                errors.count(gpu.error_source)
            if gpu.folded:
                _hold_counters(gpu, rows, len(rows) > before)
        for gone in gpus[count:]:
            if gone.folded:
                _hold_counters(gone, rows, False)
        return series

    def _read_gpu(self, gpu: _Gpu, rows: list[GpuRow], now: float) -> bool:
        """Appends one GPU's row to ``rows``; False when any reading failed."""
        nvml = self._nvml
        try:
            handle = gpu.handle
            if handle is None:
                gpu.handle = handle = nvml.nvmlDeviceGetHandleByIndex(gpu.index)
            memory_total, memory_used = self._unpack_memory(nvml.nvmlDeviceGetMemoryInfo(handle))
        except Exception:
            gpu.handle = None  # may be stale after a reset: look it up again next poll
            return False
        # Optional readings: each skipped once NOT_SUPPORTED; any other failure fails this
        # GPU's poll (counted once) and the remaining readings are still taken.
        ok = True
        utilization = memory_busy = power = sm_clock = None
        nvlink_tx = nvlink_rx = pcie_tx = pcie_rx = None
        if gpu.ask_utilization:
            try:
                busy_percent, memory_busy_percent = self._unpack_utilization(
                    nvml.nvmlDeviceGetUtilizationRates(handle))
            except Exception as exc:
                if self._is_not_supported(exc):
                    gpu.ask_utilization = False
                else:
                    ok = False
            else:
                utilization = busy_percent / PERCENT
                memory_busy = memory_busy_percent / PERCENT
                last_seen = gpu.last_seen
                if last_seen is not None and 0 < now - last_seen <= MAX_SAMPLE_GAP_SECONDS:
                    gpu.busy_seconds += utilization * (now - last_seen)
                gpu.last_seen = now
        if gpu.ask_power:
            try:
                power = nvml.nvmlDeviceGetPowerUsage(handle) / MILLIWATTS_PER_WATT
            except Exception as exc:
                if self._is_not_supported(exc):
                    gpu.ask_power = False
                else:
                    ok = False
        energy = None
        if gpu.ask_energy:
            try:
                energy = (nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
                          / MILLIJOULES_PER_JOULE)
            except Exception as exc:
                if self._is_not_supported(exc) or self._is_missing(exc):
                    gpu.ask_energy = False
                else:
                    ok = False
        if not gpu.ask_energy and power is not None:  # the counter's stand-in
            seen = gpu.power_seen
            if seen is not None and 0 < now - seen <= MAX_SAMPLE_GAP_SECONDS:
                gpu.energy_joules += power * (now - seen)
            gpu.power_seen = now
            energy = gpu.energy_joules
        if gpu.ask_sm_clock:
            try:
                sm_clock = nvml.nvmlDeviceGetClockInfo(handle, self._clock_sm) * HERTZ_PER_MHZ
            except Exception as exc:
                if self._is_not_supported(exc):
                    gpu.ask_sm_clock = False
                else:
                    ok = False
        request = gpu.fields
        if request is not None:
            try:
                fields = request.unpack(nvml.nvmlDeviceGetFieldValues(handle, request.ids))
            except Exception as exc:
                if self._is_not_supported(exc):
                    gpu.fields = None
                else:
                    ok = False
            else:
                counters = gpu.counters
                values: tuple[float, ...] = fields[2::3]
                failed: tuple[int, ...] = ()  # positions of pairs that answered an error
                # Past the first reading, every return code 0 is the only common case.
                if counters.widths is None or any(fields[1::3]):
                    values, failed = self._check_fields(gpu, fields)
                    request, counters = gpu.fields, gpu.counters
                    ok = ok and not failed
                if request is not None:
                    totals = counters.update(values)
                    if request.nvlink and 0 not in failed:
                        nvlink_tx = totals[0] * KIB
                        nvlink_rx = totals[1] * KIB
                    at = request.pcie_at
                    if at >= 0 and at // 2 not in failed:
                        tx, rx = totals[at], totals[at + 1]
                        last = gpu.pcie_last
                        elapsed = now - gpu.pcie_time
                        gpu.pcie_last = (tx, rx)
                        gpu.pcie_time = now
                        if last is not None and 0 < elapsed <= MAX_SAMPLE_GAP_SECONDS:
                            pcie_tx = (tx - last[0]) / elapsed
                            pcie_rx = (rx - last[1]) / elapsed
        # Busy seconds from the first utilization reading on (then frozen if it stops).
        busy = gpu.busy_seconds if gpu.last_seen is not None else None
        rows.append((gpu.labels, utilization, memory_busy, float(memory_used),
                     float(memory_total), busy, power, sm_clock, nvlink_tx, nvlink_rx,
                     pcie_tx, pcie_rx, energy))
        return ok

    def _check_fields(self, gpu: _Gpu,
                      decoded: tuple[int, ...]) -> tuple[tuple[float, ...], tuple[int, ...]]:
        """A GPU's first field values, or ones where some field answered an error.

        A pair this driver does not have is dropped from the GPU's request (logged once,
        not counted), keeping the other pair's counter history. A pair that answered any
        other error is failed for this poll: its raw values are taken as unchanged (the
        previous ones, or 0 before any), so its totals stand still and the next good
        reading counts what it missed, while the other pair is read as usual. The first
        reading without a failure sets the counters' widths from the value types.
        Returns the raw values for the request as it now is, and the positions of the
        failed pairs in it."""
        request = gpu.fields
        assert request is not None
        kept: list[int] = []
        failing: list[int] = []
        for position, name in enumerate(request.pairs):
            returns = decoded[6 * position + 1], decoded[6 * position + 4]
            code = next((code for code in returns if code != NVML_SUCCESS), NVML_SUCCESS)
            if code in self._field_unavailable:
                logger.info("GPU %d: no %s counters from this driver; not asked again",
                            gpu.index, name)
                continue
            if code != NVML_SUCCESS:
                failing.append(len(kept))
            kept.append(position)
        if len(kept) < len(request.pairs):
            names = [request.pairs[position] for position in kept]
            gpu.fields = self._request(nvlink=NVLINK in names, pcie=PCIE in names)
            gpu.counters = gpu.counters.select(
                tuple(index for position in kept for index in (2 * position, 2 * position + 1)))
            decoded = tuple(value for position in kept
                            for value in decoded[6 * position:6 * position + 6])
        values: tuple[float, ...] = decoded[2::3]
        counters = gpu.counters
        if failing:
            previous = counters.last or (0,) * len(values)
            values = tuple(
                previous[index] if index // 2 in failing else value
                for index, value in enumerate(values))
        elif counters.widths is None:
            counters.widths = tuple(COUNTER_WRAP.get(value_type, 0)
                                    for value_type in decoded[0::3])
        return values, tuple(failing)

    def _is_not_supported(self, exc: Exception) -> bool:
        return getattr(exc, "value", None) == self._not_supported

    def _is_missing(self, exc: Exception) -> bool:
        """The driver (or the binding) has no such function: an older NVML."""
        return isinstance(exc, AttributeError) or getattr(
            exc, "value", None) == NVML_ERROR_FUNCTION_NOT_FOUND

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
