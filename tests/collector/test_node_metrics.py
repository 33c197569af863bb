"""Per-node last mile from the agent's NIC counters: packets/s, bytes/s, packet size."""

from __future__ import annotations

import pytest

from tokenpath import attributes as A
from tokenpath import metric_names as M
from tokenpath.collector.node_metrics import NodeMetricsState, nic_last_mile
from tokenpath.collector.receivers.otlp_decode import MetricPoint


def _point(name: str, device: str, value: float, seconds: float) -> MetricPoint:
    return MetricPoint(name, value, int(seconds * 1e9), {M.LABEL_DEVICE: device},
                       {A.NODE: "gpu-node-1"}, True)


def test_the_average_packet_size_of_a_token_per_packet_node() -> None:
    state = NodeMetricsState()
    for t, packets, sent in ((10.0, 1_000, 200_000), (12.0, 21_000, 5_800_000)):
        state.consume_points([
            _point(M.NODE_NET_TX_PACKETS.name, "eth0", packets, t),
            _point(M.NODE_NET_TX_BYTES.name, "eth0", sent, t),
            _point(M.NODE_NET_TX_PACKETS.name, "lo", packets * 5, t),  # loopback: ignored
            _point(M.NODE_NET_TX_BYTES.name, "lo", sent * 5, t),
        ])
    (node,) = nic_last_mile(state, M.NODE_NET_TX_BYTES.name, M.NODE_NET_TX_PACKETS.name,
                            M.LABEL_DEVICE)
    assert node["node"] == "gpu-node-1"
    assert node["transmit_packets_per_second"] == pytest.approx(10_000)
    assert node["average_packet_bytes"] == pytest.approx(280)  # SSE token events


def test_one_sample_or_a_counter_reset_gives_no_rate() -> None:
    state = NodeMetricsState()
    state.consume_points([_point(M.NODE_NET_TX_PACKETS.name, "eth0", 500, 1.0)])
    assert nic_last_mile(state, M.NODE_NET_TX_BYTES.name, M.NODE_NET_TX_PACKETS.name,
                         M.LABEL_DEVICE) == []
    state.consume_points([_point(M.NODE_NET_TX_PACKETS.name, "eth0", 10, 2.0)])  # reset
    assert state.rates("gpu-node-1", M.NODE_NET_TX_PACKETS.name) == {}
