"""One poll of the node: GPUs, NICs and engines folded into a :class:`Snapshot`.

The poller owns everything that must persist between polls: the monotonic accumulators
(NVLink and NIC counters survive device resets), the integrated GPU busy time, the
previous NIC totals (for the average packet size over the last interval), the error
counts and the bounded label sets.
"""

from __future__ import annotations

from collections.abc import Callable

from tokenpath.agent.engine_scraper import EngineScraper
from tokenpath.agent.monotonic import MonotonicCounters
from tokenpath.agent.nic_sampler import NicSampler
from tokenpath.agent.nvml_sampler import GpuReading, NvmlSampler
from tokenpath.agent.snapshot import BoundedLabel, ErrorCounts, Snapshot

from tokenpath import metric_names as mn

# Longest gap over which a utilization reading is integrated into busy seconds: after a
# GPU was unreadable for longer, the gap is not guessed.
MAX_BUSY_INTEGRATION_GAP_SECONDS = 10.0

MAX_TRACKED_NICS = 4096

_NIC_COUNTER_SPECS = (
    mn.NODE_NET_RX_BYTES, mn.NODE_NET_TX_BYTES, mn.NODE_NET_RX_PACKETS,
    mn.NODE_NET_TX_PACKETS, mn.NODE_NET_RX_DROPS, mn.NODE_NET_TX_DROPS,
)


class NodePoller:
    def __init__(
        self,
        *,
        nvml_sampler: NvmlSampler,
        nic_sampler: NicSampler,
        engine_scraper: EngineScraper | None,
        clock: Callable[[], float],
        wall_clock_ns: Callable[[], int],
        max_devices: int,
        max_sources: int,
    ) -> None:
        self._nvml = nvml_sampler
        self._nics = nic_sampler
        self._engines = engine_scraper
        self._clock = clock
        self._wall_clock_ns = wall_clock_ns
        self.errors = ErrorCounts(max_sources)
        self._device_label = BoundedLabel(max_devices)
        self._gpu_label = BoundedLabel(max_devices)
        self._counters = MonotonicCounters()
        self._busy_seconds: dict[int, float] = {}
        self._gpu_last_seen: dict[int, float] = {}
        self._nic_previous: dict[str, tuple[float, float, float, float]] = {}
        self.push_errors = 0.0

    @property
    def nvml_sampler(self) -> NvmlSampler:
        return self._nvml

    def poll(self) -> Snapshot:
        started = self._clock()
        snapshot = Snapshot(self._wall_clock_ns())
        errors = self.errors
        gpus = self._nvml.read(errors)
        now = self._clock()
        snapshot.add(mn.AGENT_NVML_UP, (), 1.0 if self._nvml.up else 0.0)
        for gpu in gpus:
            self._add_gpu(snapshot, gpu, now)
        self._add_nics(snapshot)
        if self._engines is not None:
            self._add_engines(snapshot)
        for source, count in errors.items():
            snapshot.add(mn.AGENT_SCRAPE_ERRORS, (source,), count)
        snapshot.add(mn.AGENT_OTLP_PUSH_ERRORS, (), self.push_errors)
        snapshot.add(mn.AGENT_POLL_SECONDS, (), self._clock() - started)
        return snapshot

    def _add_gpu(self, snapshot: Snapshot, gpu: GpuReading, now: float) -> None:
        index = gpu.index
        labels = (self._gpu_label(str(index)),)
        add = snapshot.add
        add(mn.GPU_UTILIZATION, labels, gpu.utilization_ratio)
        add(mn.GPU_MEMORY_BW_UTIL, labels, gpu.memory_bandwidth_ratio)
        add(mn.GPU_MEMORY_USED, labels, gpu.memory_used_bytes)
        add(mn.GPU_MEMORY_TOTAL, labels, gpu.memory_total_bytes)
        if gpu.power_watts is not None:
            add(mn.GPU_POWER, labels, gpu.power_watts)
        if gpu.sm_clock_hertz is not None:
            add(mn.GPU_SM_CLOCK, labels, gpu.sm_clock_hertz)
        if gpu.pcie_tx_bytes_per_second is not None:
            add(mn.GPU_PCIE_TX, labels, gpu.pcie_tx_bytes_per_second)
        if gpu.pcie_rx_bytes_per_second is not None:
            add(mn.GPU_PCIE_RX, labels, gpu.pcie_rx_bytes_per_second)
        if gpu.nvlink_tx_bytes is not None:
            total = self._counters.update(("nvlink_tx", index), gpu.nvlink_tx_bytes)
            if total is not None:
                add(mn.GPU_NVLINK_TX, labels, total)
        if gpu.nvlink_rx_bytes is not None:
            total = self._counters.update(("nvlink_rx", index), gpu.nvlink_rx_bytes)
            if total is not None:
                add(mn.GPU_NVLINK_RX, labels, total)
        busy = self._busy_seconds.get(index, 0.0)
        last = self._gpu_last_seen.get(index)
        if last is not None:
            gap = now - last
            if 0 < gap <= MAX_BUSY_INTEGRATION_GAP_SECONDS:
                busy += gpu.utilization_ratio * gap
        self._busy_seconds[index] = busy
        self._gpu_last_seen[index] = now
        add(mn.GPU_BUSY_SECONDS, labels, busy)

    def _add_nics(self, snapshot: Snapshot) -> None:
        update = self._counters.update
        add = snapshot.add
        previous = self._nic_previous
        for nic in self._nics.read(self.errors):
            device = nic.device
            labels = (self._device_label(device),)
            raws = (nic.rx_bytes, nic.tx_bytes, nic.rx_packets, nic.tx_packets,
                    nic.rx_drops, nic.tx_drops)
            totals: list[float] = []
            for position, (spec, raw) in enumerate(zip(_NIC_COUNTER_SPECS, raws, strict=True)):
                total = update((device, position), float(raw))
                if total is None:
                    break
                add(spec, labels, total)
                totals.append(total)
            else:
                rx_bytes, tx_bytes, rx_packets, tx_packets = totals[:4]
                before = previous.get(device)
                # A mean packet size of several devices folded into "other" means nothing.
                if before is not None and labels[0] != mn.OTHER_LABEL_VALUE:
                    add(mn.NODE_NET_RX_AVG_PACKET, labels,
                        _mean_size(rx_bytes - before[0], rx_packets - before[2]))
                    add(mn.NODE_NET_TX_AVG_PACKET, labels,
                        _mean_size(tx_bytes - before[1], tx_packets - before[3]))
                if before is not None or len(previous) < MAX_TRACKED_NICS:
                    previous[device] = (rx_bytes, tx_bytes, rx_packets, tx_packets)

    def _add_engines(self, snapshot: Snapshot) -> None:
        assert self._engines is not None
        readings = self._engines.read(self.errors)
        for (spec, labels), value in readings.counters.items():
            snapshot.add(spec, labels, value)
        for (spec, labels), value in readings.gauges.items():
            snapshot.add(spec, labels, value)
        for source, up in readings.up.items():
            snapshot.add(mn.ENGINE_UP, (source,), up)


def _mean_size(byte_delta: float, packet_delta: float) -> float:
    return byte_delta / packet_delta if packet_delta > 0 else 0.0
