"""One poll of the node: GPUs, NICs and engines folded into a :class:`Snapshot`.

The poller owns what must persist between polls outside the GPUs (whose per-GPU state
the :class:`NvmlSampler` keeps): the NIC counters made monotonic across device resets,
the previous NIC totals (for the average packet size over the last interval), the error
counts and the bounded label sets. It runs every second forever, so the per-series work
is plain dict writes (measured against the raw calls in ``bench/agent_bench.py``).
"""

from __future__ import annotations

from collections.abc import Callable

from tokenpath import metric_names as mn
from tokenpath.agent.engine_scraper import EngineScraper
from tokenpath.agent.nic_sampler import NicSampler
from tokenpath.agent.nvml_sampler import NvmlSampler
from tokenpath.agent.snapshot import ErrorCounts, LabelValues, Snapshot
from tokenpath.labels import BoundedLabel

MAX_TRACKED_NICS = 4096

Series = dict[LabelValues, float]


class _NicState:
    """Last raw counters and monotonic totals of one NIC, in SYSFS/psutil field order
    (rx_bytes, tx_bytes, rx_packets, tx_packets, rx_drops, tx_drops)."""

    __slots__ = ("labels", "last", "totals")

    def __init__(self, labels: LabelValues, raws: list[float]) -> None:
        self.labels = labels
        self.last = raws
        self.totals = list(raws)

    def update(self, raws: list[float]) -> list[float]:
        last, totals = self.last, self.totals
        for i in range(6):
            raw, previous = raws[i], last[i]
            # A drop is a reset to zero (device re-created): count the new raw value.
            totals[i] += raw - previous if raw >= previous else raw
        self.last = raws
        return totals


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
        self._nic_state: dict[str, _NicState] = {}
        self.push_errors = 0.0

    @property
    def nvml_sampler(self) -> NvmlSampler:
        return self._nvml

    def poll(self) -> Snapshot:
        started = self._clock()
        snapshot = Snapshot(self._wall_clock_ns())
        points = snapshot.points
        points[mn.AGENT_NVML_UP] = {(): 0.0}
        self._nvml.read(self.errors, self._gpu_label).add_to(points)
        if self._nvml.up:
            points[mn.AGENT_NVML_UP] = {(): 1.0}
        self._add_nics(points)
        if self._engines is not None:
            self._add_engines(snapshot)
        errors = self.errors.items()
        if errors:
            points[mn.AGENT_SCRAPE_ERRORS] = {(source,): count for source, count in errors}
        points[mn.AGENT_OTLP_PUSH_ERRORS] = {(): self.push_errors}
        points[mn.AGENT_POLL_SECONDS] = {(): self._clock() - started}
        return snapshot

    def _add_nics(self, points: dict[mn.MetricSpec, Series]) -> None:
        readings = self._nics.read(self.errors)
        if not readings:
            return
        rx_bytes: Series = {}
        tx_bytes: Series = {}
        rx_packets: Series = {}
        tx_packets: Series = {}
        rx_drops: Series = {}
        tx_drops: Series = {}
        rx_mean: Series = {}
        tx_mean: Series = {}
        states = self._nic_state
        other = mn.OTHER_LABEL_VALUE
        for device, raws in readings:
            state = states.get(device)
            if state is None:
                if len(states) >= MAX_TRACKED_NICS:
                    continue
                states[device] = state = _NicState((self._device_label(device),), raws)
                labels = state.labels
                label = labels[0]
                totals = state.totals
            else:
                labels = state.labels
                label = labels[0]
                rx_bytes_before, tx_bytes_before, rx_packets_before, tx_packets_before = (
                    state.totals[:4])
                totals = state.update(raws)
                # A mean packet size of several devices folded into "other" means nothing.
                if label != other:
                    packets = totals[2] - rx_packets_before
                    rx_mean[labels] = (totals[0] - rx_bytes_before) / packets if packets else 0.0
                    packets = totals[3] - tx_packets_before
                    tx_mean[labels] = (totals[1] - tx_bytes_before) / packets if packets else 0.0
            if label == other and labels in rx_bytes:
                for series, value in zip((rx_bytes, tx_bytes, rx_packets, tx_packets,
                                          rx_drops, tx_drops), totals, strict=True):
                    series[labels] += value
                continue
            rx_bytes[labels] = totals[0]
            tx_bytes[labels] = totals[1]
            rx_packets[labels] = totals[2]
            tx_packets[labels] = totals[3]
            rx_drops[labels] = totals[4]
            tx_drops[labels] = totals[5]
        points[mn.NODE_NET_RX_BYTES] = rx_bytes
        points[mn.NODE_NET_TX_BYTES] = tx_bytes
        points[mn.NODE_NET_RX_PACKETS] = rx_packets
        points[mn.NODE_NET_TX_PACKETS] = tx_packets
        points[mn.NODE_NET_RX_DROPS] = rx_drops
        points[mn.NODE_NET_TX_DROPS] = tx_drops
        if rx_mean:
            points[mn.NODE_NET_RX_AVG_PACKET] = rx_mean
            points[mn.NODE_NET_TX_AVG_PACKET] = tx_mean

    def _add_engines(self, snapshot: Snapshot) -> None:
        assert self._engines is not None
        readings = self._engines.read(self.errors)
        for (spec, labels), value in readings.counters.items():
            snapshot.add(spec, labels, value)
        for (spec, labels), value in readings.gauges.items():
            snapshot.add(spec, labels, value)
        for source, up in readings.up.items():
            snapshot.add(mn.ENGINE_UP, (source,), up)
