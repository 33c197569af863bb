"""Leak 3, the last mile: a packet (and a write, a syscall, a TLS record, an interrupt) per
streamed token.

What costs money and latency is not a write under some byte size but how many packets the
stream needs per output token, and how many wire bytes per payload byte they carry. Per
streamed record (more than one write, at least one output token):

- ``packets_per_output_token`` = the response's TCP segments / its output tokens. The
  gateway shim counts the segments (``tokenpath.response.packets``: ``ceil(bytes / MSS)``
  per write); without it each write is taken as one segment;
- ``wire_bytes_per_payload_byte`` = (payload + segments x 90 B of IP, TCP and Ethernet
  framing) / payload (instrumentation/network.py);
- ``response_seconds_per_output_token``: the response path's time per token, beside the
  engine's time per output token (TPOT).

A stream *leaks* when its packets per output token reach ``threshold`` (default 0.5: a
write carries two tokens or fewer). The coalescing what-if writes N tokens per write:
``max(ceil(token writes / N) + other writes, ceil(bytes / MSS))`` segments (modeled; the
other writes are a stream's usage chunk and ``[DONE]``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tokenpath.records import RequestRecord
from tokenpath.wire_sizes import DEFAULT_MSS_BYTES

DEFAULT_PACKETS_PER_TOKEN_THRESHOLD = 0.5
COALESCE_WHATIF_TOKENS = (4, 16)


def is_stream(record: RequestRecord) -> bool:
    return record.response_chunks > 1 and record.output_tokens > 0


def packets_of(record: RequestRecord) -> int:
    """The response's segments: the shim's count, else one per write."""
    return record.response_packets or record.response_chunks


def packets_per_output_token(record: RequestRecord) -> float | None:
    return packets_of(record) / record.output_tokens if is_stream(record) else None


@dataclass(frozen=True, slots=True)
class LastMileSummary:
    streams: int
    leaking_streams: int
    threshold: float
    packets_per_output_token: float | None  # token-weighted over the streams
    wire_bytes_per_payload_byte: float | None
    response_seconds_per_output_token: float | None
    engine_tpot_seconds: float | None
    packets_estimated_from_writes: bool
    coalescing: dict[int, tuple[float | None, float | None]]  # N -> (ppt, wire/payload)

    def to_json(self) -> dict[str, object]:
        return {
            "streams": self.streams,
            "leaking_streams": self.leaking_streams,
            "leaking_share": self.leaking_streams / self.streams if self.streams else None,
            "threshold_packets_per_token": self.threshold,
            "packets_per_output_token": self.packets_per_output_token,
            "wire_bytes_per_payload_byte": self.wire_bytes_per_payload_byte,
            "response_seconds_per_output_token": self.response_seconds_per_output_token,
            "engine_tpot_seconds": self.engine_tpot_seconds,
            "packets_estimated_from_writes": self.packets_estimated_from_writes,
            "coalescing_whatif": [
                {"tokens_per_write": n, "packets_per_output_token": ppt,
                 "wire_bytes_per_payload_byte": wire, "provenance": "modeled"}
                for n, (ppt, wire) in sorted(self.coalescing.items())],
        }


def coalesced_packets(record: RequestRecord, tokens_per_write: int) -> int:
    """Segments with ``tokens_per_write`` tokens per write: the token writes coalesce, the
    writes beyond one per token (a usage chunk, ``[DONE]``) stay."""
    token_writes = min(record.response_chunks, record.output_tokens)
    other_writes = record.response_chunks - token_writes
    writes = math.ceil(token_writes / tokens_per_write) + other_writes
    return max(writes, math.ceil(record.response_bytes / DEFAULT_MSS_BYTES), 1)
