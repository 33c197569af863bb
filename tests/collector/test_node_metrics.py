"""Per-node last mile from the agent's NIC counters: packets/s, bytes/s, packet size."""

from __future__ import annotations

import pytest

from tokenpath import attributes as A
from tokenpath import metric_names as M
from tokenpath.collector.node_metrics import NodeMetricsState, kv_measured_causes, nic_last_mile
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
    # loopback apart: its traffic never crosses the last mile, and is named as such
    assert node["devices"] == ["eth0"] and node["loopback_devices"] == ["lo"]
    assert node["loopback_packets_per_second"] == pytest.approx(50_000)
    assert node["loopback_average_packet_bytes"] == pytest.approx(280)


def test_a_node_whose_traffic_is_all_on_loopback_says_so() -> None:
    """A single-machine demo: its NIC counters move only on lo; the physical figures are
    zero with no packet size, and the loopback ones carry the traffic."""
    state = NodeMetricsState()
    for t, packets, sent in ((10.0, 100, 10_000), (12.0, 2_100, 610_000)):
        state.consume_points([
            _point(M.NODE_NET_TX_PACKETS.name, "eth0", 7, t),  # idle NIC
            _point(M.NODE_NET_TX_BYTES.name, "eth0", 700, t),
            _point(M.NODE_NET_TX_PACKETS.name, "lo", packets, t),
            _point(M.NODE_NET_TX_BYTES.name, "lo", sent, t),
            _point(M.NODE_NET_TX_PACKETS.name, "docker0", packets, t),  # virtual: neither
        ])
    (node,) = nic_last_mile(state, M.NODE_NET_TX_BYTES.name, M.NODE_NET_TX_PACKETS.name,
                            M.LABEL_DEVICE)
    assert node["transmit_packets_per_second"] == 0
    assert node["average_packet_bytes"] is None
    assert node["loopback_packets_per_second"] == pytest.approx(1_000)
    assert node["loopback_average_packet_bytes"] == pytest.approx(300)


def test_one_sample_or_a_counter_reset_gives_no_rate() -> None:
    state = NodeMetricsState()
    state.consume_points([_point(M.NODE_NET_TX_PACKETS.name, "eth0", 500, 1.0)])
    assert nic_last_mile(state, M.NODE_NET_TX_BYTES.name, M.NODE_NET_TX_PACKETS.name,
                         M.LABEL_DEVICE) == []
    state.consume_points([_point(M.NODE_NET_TX_PACKETS.name, "eth0", 10, 2.0)])  # reset
    assert state.rates("gpu-node-1", M.NODE_NET_TX_PACKETS.name) == {}


def _kv_point(cause: str, value: float, seconds: float, engine: str = "vllm-0") -> MetricPoint:
    return MetricPoint(M.KV_RECOMPUTED_TOKENS.name, value, int(seconds * 1e9),
                       {M.LABEL_ENGINE: engine, M.LABEL_MODEL: "m", M.LABEL_CAUSE: cause},
                       {A.NODE: "gpu-node-1"}, True)


def test_measured_causes_from_the_agents_kv_counters() -> None:
    state = NodeMetricsState()
    assert kv_measured_causes(state, M.KV_RECOMPUTED_TOKENS.name, M.LABEL_ENGINE,
                              M.LABEL_MODEL, M.LABEL_CAUSE) == []
    state.consume_points([_kv_point("evicted", 320, 10.0), _kv_point("cold", 64, 10.0)])
    state.consume_points([_kv_point("evicted", 960, 12.0), _kv_point("cold", 64, 12.0)])
    rows = kv_measured_causes(state, M.KV_RECOMPUTED_TOKENS.name, M.LABEL_ENGINE,
                              M.LABEL_MODEL, M.LABEL_CAUSE)
    assert rows == [
        {"node": "gpu-node-1", "engine": "vllm-0", "model": "m", "cause": "cold",
         "tokens": 64, "tokens_per_second": 0.0, "dollars_per_hour": None},
        {"node": "gpu-node-1", "engine": "vllm-0", "model": "m", "cause": "evicted",
         "tokens": 960, "tokens_per_second": pytest.approx(320.0), "dollars_per_hour": None},
    ]
    priced = kv_measured_causes(state, M.KV_RECOMPUTED_TOKENS.name, M.LABEL_ENGINE,
                                M.LABEL_MODEL, M.LABEL_CAUSE, dollars_per_token=1e-6)
    assert [row["dollars_per_hour"] for row in priced] == [0.0, pytest.approx(1.152)]
