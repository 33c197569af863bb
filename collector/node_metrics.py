"""Latest OTLP metric points per node (from the agent): the NIC last-mile view reads them;
the GPU energy counters also go on to the cost attributor's readings
(:class:`tokenpath.collector.cost.energy.GpuEnergyReadings`)."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tokenpath.collector.interfaces import PointsConsumer
from tokenpath.collector.receivers.otlp_decode import MetricPoint
from tokenpath.identity import node_of_resource

DEFAULT_MAX_SERIES = 50_000
SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True, slots=True)
class SeriesKey:
    node: str
    name: str
    labels: tuple[tuple[str, str], ...]


class NodeMetricsState:
    """Bounded map of the newest value of each (node, metric, labels) series; the points
    also go to ``downstream`` (the GPU energy readings)."""

    def __init__(self, max_series: int = DEFAULT_MAX_SERIES,
                 downstream: Sequence[PointsConsumer] = ()) -> None:
        self._max_series = max_series
        self._downstream = tuple(downstream)
        self._lock = threading.Lock()
        self._latest: dict[SeriesKey, tuple[int, float]] = {}
        self._previous: dict[SeriesKey, tuple[int, float]] = {}  # the point before it

    def consume_points(self, points: Iterable[MetricPoint]) -> int:
        points = list(points)
        for consumer in self._downstream:
            consumer.consume_points(points)
        accepted = 0
        with self._lock:
            for p in points:
                node = node_of_resource(p.resource)
                key = SeriesKey(str(node), p.name,
                                tuple(sorted((k, str(v)) for k, v in p.attributes.items())))
                if key not in self._latest and len(self._latest) >= self._max_series:
                    continue  # not accepted: the ingest counts it (metric_points_dropped)
                older = self._latest.get(key)
                if older is not None and p.time_unix_nano > older[0]:
                    self._previous[key] = older
                if older is None or p.time_unix_nano >= older[0]:
                    self._latest[key] = (p.time_unix_nano, p.value)
                accepted += 1
        return accepted

    def latest(self, node: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        """Newest value of every series of ``name`` on ``node``, keyed by labels."""
        with self._lock:
            return {k.labels: v for k, (_, v) in self._latest.items()
                    if k.node == node and k.name == name}

    def nodes(self) -> set[str]:
        with self._lock:
            return {k.node for k in self._latest}

    def rates(self, node: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        """Per-second rate of every counter series of ``name`` on ``node`` between its two
        newest points (a counter reset reads as no rate)."""
        with self._lock:
            out: dict[tuple[tuple[str, str], ...], float] = {}
            for key, (t1, v1) in self._latest.items():
                if key.node != node or key.name != name or key not in self._previous:
                    continue
                t0, v0 = self._previous[key]
                if t1 > t0 and v1 >= v0:
                    out[key.labels] = (v1 - v0) / ((t1 - t0) / 1e9)
            return out


# Loopback and virtual devices carry no last-mile traffic.
IGNORED_DEVICE_PREFIXES = ("lo", "docker", "veth", "virbr", "cni", "flannel", "cali")
LOOPBACK_PREFIX = "lo"


def nic_last_mile(state: NodeMetricsState, tx_bytes: str, tx_packets: str,
                  device_label: str) -> list[dict[str, object]]:
    """Per node, from the agent's NIC counters: transmit packets/s, bytes/s and the average
    packet size (bytes / packets) over its physical devices, between the last two samples;
    the same of its loopback devices apart (``loopback_*``): traffic that never leaves the
    machine, such as a single-machine demo's, which a table of physical NICs alone would
    show as none."""
    out: list[dict[str, object]] = []
    for node in sorted(state.nodes()):
        def summed(rates: dict[tuple[tuple[str, str], ...], float],
                   loopback: bool) -> tuple[float, list[str]]:
            total, devices = 0.0, []
            for labels, value in rates.items():
                device = dict(labels).get(device_label, "")
                if loopback != device.startswith(LOOPBACK_PREFIX):
                    continue
                if not loopback and device.startswith(IGNORED_DEVICE_PREFIXES):
                    continue
                total += value
                devices.append(device)
            return total, sorted(devices)
        packets = state.rates(node, tx_packets)
        if not packets:
            continue
        sent = state.rates(node, tx_bytes)
        packets_per_second, devices = summed(packets, False)
        bytes_per_second, _ = summed(sent, False)
        lo_packets, lo_devices = summed(packets, True)
        lo_bytes, _ = summed(sent, True)
        out.append({"node": node, "devices": devices,
                    "transmit_packets_per_second": packets_per_second,
                    "transmit_bytes_per_second": bytes_per_second,
                    "average_packet_bytes": (bytes_per_second / packets_per_second
                                             if packets_per_second > 0 else None),
                    "loopback_devices": lo_devices,
                    "loopback_packets_per_second": lo_packets,
                    "loopback_bytes_per_second": lo_bytes,
                    "loopback_average_packet_bytes": (lo_bytes / lo_packets
                                                      if lo_packets > 0 else None)})
    return out


def kv_measured_causes(state: NodeMetricsState, recomputed: str, engine_label: str,
                       model_label: str, cause_label: str,
                       dollars_per_token: float | None = None) -> list[dict[str, object]]:
    """Per node, engine, model and cause, from the agents' KV-cache event counters
    (tokenpath_kv_recomputed_tokens): the tokens counted since each agent started, and
    tokens/s between its last two pushes (None before the second); with
    ``dollars_per_token`` (the window's prefill dollars per computed prompt token), that
    rate in dollars per hour."""
    out: list[dict[str, object]] = []
    for node in sorted(state.nodes()):
        totals = state.latest(node, recomputed)
        if not totals:
            continue
        rates = state.rates(node, recomputed)
        for labels, tokens in sorted(totals.items()):
            named = dict(labels)
            rate = rates.get(labels)
            out.append({"node": node, "engine": named.get(engine_label, ""),
                        "model": named.get(model_label, ""),
                        "cause": named.get(cause_label, ""), "tokens": tokens,
                        "tokens_per_second": rate,
                        "dollars_per_hour": (rate * SECONDS_PER_HOUR * dollars_per_token
                                             if rate is not None
                                             and dollars_per_token is not None else None)})
    return out
