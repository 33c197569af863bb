"""The last-mile summary from a list of records (views.last_mile_of's oracle, the report's
and ``/api/leaks``' ``last_mile``): tokenpath/last_mile.py's figures summed over the
streamed records."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tokenpath.last_mile import (
    COALESCE_WHATIF_TOKENS,
    DEFAULT_PACKETS_PER_TOKEN_THRESHOLD,
    LastMileSummary,
    coalesced_packets,
    is_stream,
    packets_of,
)
from tokenpath.records import RequestRecord
from tokenpath.stages import StageId
from tokenpath.wire_sizes import PACKET_OVERHEAD_BYTES


def _ratios(streams: Sequence[RequestRecord], packets: Iterable[int]
            ) -> tuple[float | None, float | None]:
    counts = list(packets)
    tokens = sum(r.output_tokens for r in streams)
    payload = sum(r.response_bytes for r in streams)
    total = sum(counts)
    ppt = total / tokens if tokens else None
    wire = (payload + total * PACKET_OVERHEAD_BYTES) / payload if payload else None
    return ppt, wire


def summarize_last_mile(records: Iterable[RequestRecord],
                        threshold: float = DEFAULT_PACKETS_PER_TOKEN_THRESHOLD,
                        coalesce: Sequence[int] = COALESCE_WHATIF_TOKENS) -> LastMileSummary:
    streams = [r for r in records if is_stream(r)]
    ppt, wire = _ratios(streams, (packets_of(r) for r in streams))
    leaking = sum(1 for r in streams if packets_of(r) / r.output_tokens >= threshold)
    response = sum(r.stages[StageId.RESPONSE_PATH].seconds for r in streams
                   if StageId.RESPONSE_PATH in r.stages)
    tokens = sum(r.output_tokens for r in streams)
    tpots = [r.tpot_seconds for r in streams if r.tpot_seconds is not None]
    return LastMileSummary(
        streams=len(streams),
        leaking_streams=leaking,
        threshold=threshold,
        packets_per_output_token=ppt,
        wire_bytes_per_payload_byte=wire,
        response_seconds_per_output_token=response / tokens if tokens and response else None,
        engine_tpot_seconds=sum(tpots) / len(tpots) if tpots else None,
        packets_estimated_from_writes=any(not r.response_packets for r in streams),
        coalescing={n: _ratios(streams, (coalesced_packets(r, n) for r in streams))
                    for n in coalesce},
    )
