"""Leak 3 as packets per output token and wire bytes per payload byte, and the coalescing
what-if."""

from __future__ import annotations

import pytest

from testkit.oracles.last_mile import summarize_last_mile
from tokenpath.last_mile import coalesced_packets, packets_per_output_token
from tokenpath.records import RequestRecord
from tokenpath.wire_sizes import PACKET_OVERHEAD_BYTES

SSE_CHUNK_BYTES = 200  # one token in an OpenAI-style SSE event


def _stream(index: int, tokens: int, tokens_per_write: int = 1) -> RequestRecord:
    writes = -(-tokens // tokens_per_write) + 1  # and the closing [DONE]
    return RequestRecord(trace_id=f"{index:032x}", output_tokens=tokens,
                         response_chunks=writes, response_packets=writes,
                         response_bytes=writes * SSE_CHUNK_BYTES * tokens_per_write)


def test_a_token_per_write_stream_is_a_packet_per_token_and_leaks() -> None:
    records = [_stream(i, 40) for i in range(5)]
    summary = summarize_last_mile(records)
    assert summary.packets_per_output_token == pytest.approx(41 / 40)
    assert summary.packets_per_output_token >= 0.9
    assert summary.wire_bytes_per_payload_byte == pytest.approx(
        1 + PACKET_OVERHEAD_BYTES / SSE_CHUNK_BYTES)
    assert summary.leaking_streams == summary.streams == 5


def test_n_token_writes_are_about_one_packet_per_n_tokens_and_the_whatif_agrees() -> None:
    coalesced = [_stream(i, 64, tokens_per_write=8) for i in range(5)]
    summary = summarize_last_mile(coalesced)
    assert summary.packets_per_output_token == pytest.approx(9 / 64)
    assert summary.leaking_streams == 0
    # the what-if from the token-per-write run predicts the coalesced run
    per_token = [_stream(i, 64) for i in range(5)]
    predicted = summarize_last_mile(per_token, coalesce=(8,)).coalescing[8][0]
    assert predicted == pytest.approx(summary.packets_per_output_token, rel=0.15)


def test_a_large_write_is_several_segments_and_a_whole_response_is_not_a_stream() -> None:
    big = RequestRecord(trace_id="a" * 32, output_tokens=1000, response_chunks=2,
                        response_bytes=10_000)
    assert coalesced_packets(big, 16) == 7  # ceil(10,000 / 1,448 MSS)
    whole = RequestRecord(trace_id="b" * 32, output_tokens=50, response_chunks=1,
                          response_bytes=4_000)
    assert packets_per_output_token(whole) is None
    assert summarize_last_mile([whole]).streams == 0
