"""Per-NIC byte, packet and drop counters from psutil or /sys/class/net.

``psutil.net_io_counters(pernic=True, nowrap=False)`` reads ``/proc/net/dev`` once for
every device and is the default. psutil's own ``nowrap`` bookkeeping is off: the poller
already keeps every NIC's totals monotonic across resets (``CounterGroup``), and that
bookkeeping was about a quarter of the call's cost (``docs/agent.md``).
``/sys/class/net/<dev>/statistics/*`` (under an injectable ``sysfs_root``) is the
fallback when psutil fails, or the only source with ``source="sysfs"``. Devices matching
the exclude pattern (container veth pairs, bridges) are skipped. Values are the kernel's
raw counters; the poller makes them monotonic.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from operator import attrgetter
from pathlib import Path
from typing import Any, Literal

import psutil

from tokenpath.agent.snapshot import ErrorCounts

NicSource = Literal["auto", "psutil", "sysfs"]
NIC_SOURCES: tuple[NicSource, ...] = ("auto", "psutil", "sysfs")
DEFAULT_SYSFS_ROOT = Path("/sys")
# Per-pod and bridge devices a DaemonSet would otherwise expose one series each for.
DEFAULT_NIC_EXCLUDE = r"^(veth|cali|cilium_|lxc|docker|br-|virbr|cni|flannel|vxlan|tunl|kube-)"

SYSFS_FILES = ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_dropped", "tx_dropped")
ERROR_SOURCE_PSUTIL = "psutil"
ERROR_SOURCE_SYSFS = "sysfs"


# One NIC: its name and raw counters in NIC_FIELDS order.
NicReading = tuple[str, tuple[float, ...]]
NIC_FIELDS = ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_drops", "tx_drops")


NetIoCounters = Callable[..., Any]
# psutil's snetio fields in NIC_FIELDS order, read in C.
_PSUTIL_FIELDS = attrgetter("bytes_recv", "bytes_sent", "packets_recv", "packets_sent",
                            "dropin", "dropout")


class NicSampler:
    """Reads every non-excluded NIC; one unreadable device never fails the others."""

    def __init__(
        self,
        *,
        source: NicSource = "auto",
        sysfs_root: Path = DEFAULT_SYSFS_ROOT,
        exclude: str = DEFAULT_NIC_EXCLUDE,
        net_io_counters: NetIoCounters | None = None,
    ) -> None:
        self._source = source
        self._net_dir = Path(sysfs_root) / "class" / "net"
        self._exclude = re.compile(exclude) if exclude else None
        self._net_io_counters = net_io_counters or psutil.net_io_counters
        self._included: dict[str, bool] = {}

    def _wanted(self, device: str) -> bool:
        wanted = self._included.get(device)
        if wanted is None:
            wanted = self._exclude is None or self._exclude.search(device) is None
            if len(self._included) < 4096:
                self._included[device] = wanted
        return wanted

    def read(self, errors: ErrorCounts) -> list[NicReading]:
        if self._source != "sysfs":
            try:
                return self._read_psutil()
            except Exception:
                errors.count(ERROR_SOURCE_PSUTIL)
                if self._source == "psutil":
                    return []
        return self._read_sysfs(errors)

    def _read_psutil(self) -> list[NicReading]:
        counters = self._net_io_counters(pernic=True, nowrap=False)
        wanted = self._wanted
        return [(device, _PSUTIL_FIELDS(c)) for device, c in counters.items() if wanted(device)]

    def _read_sysfs(self, errors: ErrorCounts) -> list[NicReading]:
        try:
            devices = sorted(entry.name for entry in self._net_dir.iterdir())
        except OSError:
            errors.count(ERROR_SOURCE_SYSFS)
            return []
        readings: list[NicReading] = []
        for device in devices:
            if not self._wanted(device):
                continue
            statistics = self._net_dir / device / "statistics"
            try:
                values = tuple(float((statistics / name).read_bytes()) for name in SYSFS_FILES)
            except (OSError, ValueError):
                errors.count(f"{ERROR_SOURCE_SYSFS}:{device}")
                continue
            readings.append((device, values))
        return readings
