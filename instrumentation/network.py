"""Stages 11-13 derived from what the gateway measured: response bytes and chunk sizes.

Provenance ``derived``: arithmetic on measured counts with documented link constants.

- Each chunk the gateway writes becomes ``ceil(bytes / mss)`` TCP segments (at least one).
- ``nic_tx``: the response payload's transmit time at the link rate,
  ``payload_bytes * 8 / link_bps``.
- ``ethernet_serialize``: the framing overhead's transmit time: per packet, IPv4 + TCP
  headers (with timestamps; they already exceed Ethernet's 46-byte minimum payload, so
  no padding), and the Ethernet header, FCS, preamble and inter-frame gap. Small packets
  pay this per token: the last-mile leak.
- ``switch_hop``: ``packets * hops * switch_latency`` store-and-forward/cut-through
  latency in the fabric between engine host and gateway.
- Small chunks: writes carrying under ``small_packet_payload_bytes`` (64) bytes, each a
  packet of its own: the per-token streaming leak (``tokenpath.response.small_chunks``).
  The short last segment of a large write is not one.

When the node agent's NIC counters are present the collector may refine these; this
module only needs what a gateway sees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from tokenpath.config import AT_LEAST_ONE, check, validate_fields
from tokenpath.wire_sizes import DEFAULT_MSS_BYTES, PACKET_OVERHEAD_BYTES

DEFAULT_LINK_BITS_PER_SECOND = 25e9  # 25GbE, a common server uplink
DEFAULT_SMALL_PACKET_PAYLOAD_BYTES = 64
DEFAULT_SWITCH_HOPS = 2  # leaf and spine between an engine host and its gateway
DEFAULT_SWITCH_LATENCY_SECONDS = 1e-6  # per hop, typical data-center switch port-to-port

_NOT_NEGATIVE = check(ge=0, message="must not be negative")


@dataclass(frozen=True, slots=True)
class LinkModel:
    link_bits_per_second: float = field(default=DEFAULT_LINK_BITS_PER_SECOND, metadata=check(
        gt=0, message="must be greater than 0"))
    mss_bytes: int = field(default=DEFAULT_MSS_BYTES, metadata=AT_LEAST_ONE)
    small_packet_payload_bytes: int = DEFAULT_SMALL_PACKET_PAYLOAD_BYTES
    switch_hops: int = field(default=DEFAULT_SWITCH_HOPS, metadata=_NOT_NEGATIVE)
    switch_latency_seconds: float = field(default=DEFAULT_SWITCH_LATENCY_SECONDS,
                                          metadata=_NOT_NEGATIVE)

    def validate(self) -> None:
        validate_fields(self)


@dataclass(slots=True)
class ResponseTally:
    """Running counts of a response as the gateway writes it."""

    payload_bytes: int = 0
    chunks: int = 0
    packets: int = 0
    small_chunks: int = 0
    overhead_bytes: int = 0  # framing bytes on the wire beyond the payload

    def add_chunk(self, size: int, link: LinkModel) -> None:
        if size <= 0:
            return
        self.payload_bytes += size
        self.chunks += 1
        if size < link.small_packet_payload_bytes:
            self.small_chunks += 1
        if size < link.mss_bytes:  # one segment: every token chunk of a stream
            self.packets += 1
            self.overhead_bytes += PACKET_OVERHEAD_BYTES
            return
        full, rest = divmod(size, link.mss_bytes)
        packets = full + (1 if rest else 0)
        self.packets += packets
        # IP + TCP headers (52 B) always exceed Ethernet's 46-byte minimum payload: no padding
        self.overhead_bytes += packets * PACKET_OVERHEAD_BYTES


class NetworkStages(NamedTuple):  # made once a request: a tuple is the cheapest record
    switch_hop_seconds: float
    nic_tx_seconds: float
    ethernet_serialize_seconds: float


def derive_network_stages(tally: ResponseTally, link: LinkModel) -> NetworkStages:
    bits = link.link_bits_per_second
    return NetworkStages(
        switch_hop_seconds=tally.packets * link.switch_hops * link.switch_latency_seconds,
        nic_tx_seconds=tally.payload_bytes * 8.0 / bits,
        ethernet_serialize_seconds=tally.overhead_bytes * 8.0 / bits,
    )
