"""One poll of the node: GPUs, NICs and engines folded into a :class:`Snapshot`.

The poller owns what must persist between polls outside the GPUs (whose per-GPU state
the :class:`NvmlSampler` keeps): the NIC counters made monotonic across device resets,
the previous NIC totals (for the average packet size over the last interval), the error
counts and the bounded label sets. It runs every second forever, so it only records one
row per GPU and per NIC; the snapshot turns rows into series when it is first read
(measured against the raw calls in ``bench/agent_bench.py``). Engine pages are fetched at
most every ``engine_interval``: their counters are cumulative, and fetching a serving
engine's /metrics every second would load the engine it observes. A fetch is split over
two polls: the poll it falls due at sends every engine's request, the next one reads the
pages, so the poll thread does not wait while engines render (it still opens new
connections, and repeats at once a request whose kept-alive connection the engine had
closed). The first poll, and so ``--once``, reads them at once.
"""

from __future__ import annotations

from collections.abc import Callable

from tokenpath import metric_names as mn
from tokenpath.agent.engine_scraper import EngineReadings, EngineScraper
from tokenpath.agent.kv_index import KvTracker
from tokenpath.agent.monotonic import CounterGroup
from tokenpath.agent.nic_sampler import NicSampler
from tokenpath.agent.nvml_sampler import NvmlSampler
from tokenpath.agent.snapshot import ErrorCounts, LabelValues, Points, Snapshot, add_point
from tokenpath.labels import BoundedLabel

MAX_TRACKED_NICS = 4096
# An engine fetch is due after this share of engine_interval, so that a poll arriving a
# little early (scheduling jitter) does not push the fetch to the poll after it.
ENGINE_DUE_SHARE = 0.9


# NIC counter metrics in NIC_FIELDS order (rx/tx bytes, packets, drops).
NIC_COUNTER_METRICS: tuple[mn.MetricSpec, ...] = (
    mn.NODE_NET_RX_BYTES, mn.NODE_NET_TX_BYTES, mn.NODE_NET_RX_PACKETS,
    mn.NODE_NET_TX_PACKETS, mn.NODE_NET_RX_DROPS, mn.NODE_NET_TX_DROPS,
)
# A NIC row: label values, monotonic totals in NIC_FIELDS order, then the mean received
# and sent packet size over the last interval (None on a NIC's first poll).
NicRow = tuple[LabelValues, tuple[float, ...], float | None, float | None]


class _NicState:
    """One NIC's bounded label values and monotonic totals (NIC_FIELDS order)."""

    __slots__ = ("counters", "labels", "totals")

    def __init__(self, labels: LabelValues) -> None:
        self.labels = labels
        self.counters = CounterGroup()
        self.totals: tuple[float, ...] | None = None


def _add_nic_rows(rows: list[NicRow], points: Points) -> None:
    """Series from NIC rows; devices folded into the ``other`` label are summed."""
    labels, totals, rx_packet, tx_packet = zip(*rows, strict=True)
    if len(set(labels)) == len(labels):
        for spec, values in zip(NIC_COUNTER_METRICS, zip(*totals, strict=True), strict=True):
            points[spec] = dict(zip(labels, values, strict=True))
    else:  # several devices share the "other" label
        for spec, values in zip(NIC_COUNTER_METRICS, zip(*totals, strict=True), strict=True):
            column: dict[LabelValues, float] = {}
            for label, value in zip(labels, values, strict=True):
                column[label] = column.get(label, 0.0) + value
            points[spec] = column
    rx_mean = {label: mean for label, mean in zip(labels, rx_packet, strict=True)
               if mean is not None}
    if rx_mean:
        points[mn.NODE_NET_RX_AVG_PACKET] = rx_mean
        points[mn.NODE_NET_TX_AVG_PACKET] = {
            label: mean for label, mean in zip(labels, tx_packet, strict=True)
            if mean is not None}


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
        engine_interval: float = 0.0,
        kv_tracker: KvTracker | None = None,
    ) -> None:
        self._kv = kv_tracker
        self._nvml = nvml_sampler
        self._nics = nic_sampler
        self._engines = engine_scraper
        # Engines are scraped at most every engine_interval seconds (0: every poll); the
        # polls between repeat the last scrape's readings.
        self._engine_interval = engine_interval
        self._engine_due = 0.0
        self._engine_readings: EngineReadings | None = None
        self._clock = clock
        self._wall_clock_ns = wall_clock_ns
        self.errors = ErrorCounts(max_sources)
        self._device_label = BoundedLabel(max_devices)
        self._gpu_label = BoundedLabel(max_devices)
        self._nic_state: dict[str, _NicState] = {}
        self._other_nics: set[str] = set()  # devices folded into the "other" label
        self.push_errors = 0.0

    @property
    def nvml_sampler(self) -> NvmlSampler:
        return self._nvml

    def poll(self) -> Snapshot:
        started = self._clock()
        taken = self._wall_clock_ns()
        points: Points = {}
        gpus = self._nvml.read(self.errors, self._gpu_label)
        points[mn.AGENT_NVML_UP] = {(): 1.0 if self._nvml.up else 0.0}
        deferred = [gpus.add_to]
        nic_rows = self._nic_rows()
        if nic_rows:
            deferred.append(lambda points: _add_nic_rows(nic_rows, points))
        if self._engines is not None:
            self._add_engines(points, started)
        if self._kv is not None:
            deferred.append(self._kv.add_to)
        errors = self.errors.items()
        if errors:
            points[mn.AGENT_SCRAPE_ERRORS] = {(source,): count for source, count in errors}
        points[mn.AGENT_OTLP_PUSH_ERRORS] = {(): self.push_errors}
        points[mn.AGENT_POLL_SECONDS] = {(): self._clock() - started}
        return Snapshot(taken, points, deferred)

    def _nic_rows(self) -> list[NicRow]:
        readings = self._nics.read(self.errors)
        rows: list[NicRow] = []
        states = self._nic_state
        other = mn.OTHER_LABEL_VALUE
        for device, raws in readings:
            state = states.get(device)
            if state is None:
                if len(states) >= MAX_TRACKED_NICS:
                    continue
                states[device] = state = _NicState((self._device_label(device),))
                if state.labels[0] == other:
                    self._other_nics.add(device)
            before = state.totals
            state.totals = totals = state.counters.update(raws)
            labels = state.labels
            # A mean packet size of several devices folded into "other" means nothing.
            if before is None or labels[0] == other:
                rows.append((labels, totals, None, None))
                continue
            packets = totals[2] - before[2]
            rx_packet = (totals[0] - before[0]) / packets if packets else 0.0
            packets = totals[3] - before[3]
            tx_packet = (totals[1] - before[1]) / packets if packets else 0.0
            rows.append((labels, totals, rx_packet, tx_packet))
        if self._other_nics:
            # The "other" series sums several devices; one that vanished keeps adding
            # what it had counted, so the sum never goes backwards.
            gone = self._other_nics.difference(device for device, _ in readings)
            for device in gone:
                state = states[device]
                if state.totals is not None:
                    rows.append((state.labels, state.totals, None, None))
        return rows

    def _add_engines(self, points: Points, now: float) -> None:
        engines = self._engines
        assert engines is not None
        if engines.pending:  # requested at the previous poll: read the pages now
            self._engine_readings = engines.collect(self.errors)
        readings = self._engine_readings
        if readings is None:  # the first poll reads them at once
            self._engine_readings = readings = engines.read(self.errors)
            self._engine_due = now + self._engine_interval * ENGINE_DUE_SHARE
        elif now >= self._engine_due:  # the next poll reads what is requested now
            engines.begin()
            self._engine_due = now + self._engine_interval * ENGINE_DUE_SHARE
        for (spec, labels), value in readings.counters.items():
            add_point(points, spec, labels, value)
        for (spec, labels), value in readings.gauges.items():
            add_point(points, spec, labels, value)
        for source, up in readings.up.items():
            add_point(points, mn.ENGINE_UP, (source,), up)

    def shutdown(self) -> None:
        """Drops engine requests sent and not yet read."""
        if self._engines is not None:
            self._engines.cancel()
