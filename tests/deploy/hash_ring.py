"""Trace-id routing as the OpenTelemetry Collector's loadbalancing exporter does it
(exporter/loadbalancingexporter/consistent_hashing.go): each endpoint takes 100 positions
on a ring of 36000, at crc32(endpoint + byte(i)) mod 36000; a trace goes to the first
position at or after crc32(trace id bytes) mod 36000, wrapping around."""

from __future__ import annotations

import bisect
import zlib

RING_POSITIONS = 36000
POINTS_PER_ENDPOINT = 100


class HashRing:
    def __init__(self, endpoints: list[str]) -> None:
        taken: dict[int, str] = {}
        for endpoint in endpoints:
            for index in range(POINTS_PER_ENDPOINT):
                position = zlib.crc32(endpoint.encode() + bytes([index])) % RING_POSITIONS
                taken.setdefault(position, endpoint)
        self._positions = sorted(taken)
        self._endpoints = [taken[p] for p in self._positions]

    def endpoint_for(self, trace_id: bytes) -> str:
        position = zlib.crc32(trace_id) % RING_POSITIONS
        index = bisect.bisect_left(self._positions, position)
        return self._endpoints[index % len(self._endpoints)]
