"""Sizes on the wire that every layer borrows: the TCP segment size and the per-packet
framing of a response on a server's Ethernet uplink. The gateway shim derives the network
stages from them (tokenpath/instrumentation/network.py), the collector's last-mile
measures and leak ranking count framing with them (docs/cost-model.md, last mile)."""

from __future__ import annotations

DEFAULT_MSS_BYTES = 1448  # 1500 MTU - 20 IPv4 - 20 TCP - 12 TCP timestamps
IP_TCP_HEADER_BYTES = 52  # IPv4 20 + TCP 20 + timestamps option 12
ETHERNET_FRAMING_BYTES = 38  # header 14 + FCS 4 + preamble/SFD 8 + inter-frame gap 12
PACKET_OVERHEAD_BYTES = IP_TCP_HEADER_BYTES + ETHERNET_FRAMING_BYTES
