"""NIC counters: real psutil on the loopback interface, and a sysfs fixture tree."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path
from typing import Any

import psutil
import pytest

from testkit.fakes.fake_nvml import FakeNvml
from tokenpath import metric_names as mn
from tokenpath.agent.nic_sampler import SYSFS_FILES, NicSampler
from tokenpath.agent.node_poller import NodePoller
from tokenpath.agent.nvml_sampler import NvmlSampler

LOOPBACK = "lo"


def poller_for(nics: NicSampler) -> NodePoller:
    nvml = NvmlSampler(FakeNvml(gpus=[]), lambda: 0.0)
    nvml.start()
    return NodePoller(nvml_sampler=nvml, nic_sampler=nics, engine_scraper=None,
                      clock=lambda: 0.0, wall_clock_ns=lambda: 1, max_devices=8,
                      max_sources=16)


def write_device(root: Path, device: str, **values: int) -> None:
    statistics = root / "class" / "net" / device / "statistics"
    statistics.mkdir(parents=True, exist_ok=True)
    for name in SYSFS_FILES:
        (statistics / name).write_text(f"{values.get(name, 0)}\n")


def send_loopback_udp(packets: int, size: int) -> None:
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _ in range(packets):
            sender.sendto(b"x" * size, receiver.getsockname())
            receiver.recv(size)
    finally:
        sender.close()
        receiver.close()


@pytest.mark.skipif(LOOPBACK not in psutil.net_io_counters(pernic=True),
                    reason="no loopback interface named lo")
def test_real_psutil_on_loopback_counts_traffic_and_average_packet_size() -> None:
    poller = poller_for(NicSampler(source="psutil"))
    before = poller.poll()
    rx_before = before.get(mn.NODE_NET_RX_BYTES, (LOOPBACK,))
    tx_packets_before = before.get(mn.NODE_NET_TX_PACKETS, (LOOPBACK,))
    assert rx_before is not None and tx_packets_before is not None
    send_loopback_udp(packets=50, size=1000)
    after = poller.poll()
    rx_after = after.get(mn.NODE_NET_RX_BYTES, (LOOPBACK,))
    assert rx_after is not None
    # 50 datagrams of 1000 payload bytes (+ UDP/IP headers) crossed lo.
    assert rx_after - rx_before >= 50 * 1000
    assert after.get(mn.NODE_NET_TX_PACKETS, (LOOPBACK,)) >= tx_packets_before + 50  # type: ignore[operator]
    mean_size = after.get(mn.NODE_NET_RX_AVG_PACKET, (LOOPBACK,))
    assert mean_size is not None and mean_size > 0
    for spec in (mn.NODE_NET_TX_BYTES, mn.NODE_NET_RX_DROPS, mn.NODE_NET_TX_DROPS,
                 mn.NODE_NET_RX_PACKETS, mn.NODE_NET_TX_AVG_PACKET):
        assert after.get(spec, (LOOPBACK,)) is not None, spec.name


def test_sysfs_tree_counters_excludes_and_one_unreadable_device(tmp_path: Path) -> None:
    write_device(tmp_path, "eth0", rx_bytes=10_000, tx_bytes=5_000, rx_packets=10,
                 tx_packets=5, rx_dropped=1, tx_dropped=2)
    write_device(tmp_path, "veth1234")
    write_device(tmp_path, "ib0", rx_bytes=1)
    (tmp_path / "class" / "net" / "ib0" / "statistics" / "tx_bytes").write_text("garbage\n")
    poller = poller_for(NicSampler(source="sysfs", sysfs_root=tmp_path))
    snap = poller.poll()
    assert snap.get(mn.NODE_NET_RX_BYTES, ("eth0",)) == 10_000
    assert snap.get(mn.NODE_NET_TX_BYTES, ("eth0",)) == 5_000
    assert snap.get(mn.NODE_NET_RX_PACKETS, ("eth0",)) == 10
    assert snap.get(mn.NODE_NET_RX_DROPS, ("eth0",)) == 1
    assert snap.get(mn.NODE_NET_TX_DROPS, ("eth0",)) == 2
    assert snap.get(mn.NODE_NET_RX_BYTES, ("veth1234",)) is None
    assert snap.get(mn.NODE_NET_RX_BYTES, ("ib0",)) is None
    assert snap.get(mn.AGENT_SCRAPE_ERRORS, ("sysfs:ib0",)) == 1.0


def test_sysfs_counter_reset_never_goes_backwards_and_mean_packet_size(tmp_path: Path) -> None:
    write_device(tmp_path, "eth0", rx_bytes=10_000, rx_packets=10)
    poller = poller_for(NicSampler(source="sysfs", sysfs_root=tmp_path))
    poller.poll()
    write_device(tmp_path, "eth0", rx_bytes=16_000, rx_packets=14)
    snap = poller.poll()
    assert snap.get(mn.NODE_NET_RX_AVG_PACKET, ("eth0",)) == pytest.approx(1500.0)
    # Device re-created (driver reload): kernel counters restart from zero.
    write_device(tmp_path, "eth0", rx_bytes=900, rx_packets=1)
    snap = poller.poll()
    assert snap.get(mn.NODE_NET_RX_BYTES, ("eth0",)) == 16_900
    assert snap.get(mn.NODE_NET_RX_PACKETS, ("eth0",)) == 15
    assert snap.get(mn.NODE_NET_RX_AVG_PACKET, ("eth0",)) == pytest.approx(900.0)


def test_psutil_counter_reset_never_goes_backwards() -> None:
    # psutil's own wrap bookkeeping is off (nowrap=False): a device re-created between
    # two polls hands the poller raw counters that went down, and the poller alone keeps
    # the totals monotonic.
    snetio = type(psutil.net_io_counters(nowrap=False))  # psutil's own record type

    def counters(rx: int, tx: int, packets: int) -> Any:
        return snetio(bytes_sent=tx, bytes_recv=rx, packets_sent=packets,
                      packets_recv=packets, errin=0, errout=0, dropin=1, dropout=0)

    readings = iter([{"eth0": counters(10_000, 4_000, 8)}, {"eth0": counters(300, 100, 1)}])
    asked: list[dict[str, Any]] = []

    def net_io_counters(**kwargs: Any) -> Any:
        asked.append(kwargs)
        return next(readings)

    poller = poller_for(NicSampler(source="psutil", net_io_counters=net_io_counters))
    poller.poll()
    snap = poller.poll()
    assert asked == [{"pernic": True, "nowrap": False}] * 2
    assert snap.get(mn.NODE_NET_RX_BYTES, ("eth0",)) == 10_300
    assert snap.get(mn.NODE_NET_TX_BYTES, ("eth0",)) == 4_100
    assert snap.get(mn.NODE_NET_RX_PACKETS, ("eth0",)) == 9
    assert snap.get(mn.NODE_NET_RX_DROPS, ("eth0",)) == 1
    assert snap.get(mn.NODE_NET_RX_AVG_PACKET, ("eth0",)) == pytest.approx(300.0)


def test_auto_falls_back_to_sysfs_when_psutil_fails(tmp_path: Path) -> None:
    write_device(tmp_path, "eth0", rx_bytes=42)

    def broken(**kwargs: Any) -> Any:
        raise OSError("no /proc/net/dev")

    poller = poller_for(NicSampler(source="auto", sysfs_root=tmp_path, net_io_counters=broken))
    snap = poller.poll()
    assert snap.get(mn.NODE_NET_RX_BYTES, ("eth0",)) == 42
    assert snap.get(mn.AGENT_SCRAPE_ERRORS, ("psutil",)) == 1.0


def test_device_label_is_bounded(tmp_path: Path) -> None:
    for number in range(12):
        write_device(tmp_path, f"eth{number:02d}", rx_bytes=1)
    poller = poller_for(NicSampler(source="sysfs", sysfs_root=tmp_path))
    snap = poller.poll()
    devices = {labels[0] for labels in snap.points[mn.NODE_NET_RX_BYTES]}
    assert len(devices) == 9  # 8 admitted + "other"
    assert snap.get(mn.NODE_NET_RX_BYTES, (mn.OTHER_LABEL_VALUE,)) == 4


def test_other_never_goes_backwards_when_a_folded_device_vanishes(tmp_path: Path) -> None:
    for number in range(10):
        write_device(tmp_path, f"eth{number:02d}", rx_bytes=5)
    poller = poller_for(NicSampler(source="sysfs", sysfs_root=tmp_path))
    assert poller.poll().get(mn.NODE_NET_RX_BYTES, (mn.OTHER_LABEL_VALUE,)) == 10
    shutil.rmtree(tmp_path / "class" / "net" / "eth09")
    assert poller.poll().get(mn.NODE_NET_RX_BYTES, (mn.OTHER_LABEL_VALUE,)) == 10
