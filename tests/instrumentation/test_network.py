from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenpath.config import ConfigError
from tokenpath.instrumentation.network import (
    LinkModel,
    ResponseTally,
    derive_network_stages,
)
from tokenpath.wire_sizes import ETHERNET_FRAMING_BYTES, IP_TCP_HEADER_BYTES


def test_chunks_become_packets_and_small_ones_are_counted() -> None:
    link = LinkModel(link_bits_per_second=1e9, mss_bytes=1000, switch_hops=2,
                     switch_latency_seconds=1e-6)
    tally = ResponseTally()
    for size in (30, 200, 2500, 0):
        tally.add_chunk(size, link)
    assert tally.chunks == 3  # empty writes are not chunks
    assert tally.payload_bytes == 2730
    assert tally.packets == 1 + 1 + 3
    assert tally.small_chunks == 1  # the 30-byte chunk (2500 ends in a 500-byte segment)
    stages = derive_network_stages(tally, link)
    assert stages.nic_tx_seconds == pytest.approx(2730 * 8 / 1e9)
    overhead = 5 * (IP_TCP_HEADER_BYTES + ETHERNET_FRAMING_BYTES)
    assert stages.ethernet_serialize_seconds == pytest.approx(overhead * 8 / 1e9)
    assert stages.switch_hop_seconds == pytest.approx(5 * 2 * 1e-6)


def test_token_per_packet_streaming_pays_more_framing_than_one_buffered_write() -> None:
    link = LinkModel()
    per_token, buffered = ResponseTally(), ResponseTally()
    for _ in range(100):
        per_token.add_chunk(40, link)
    buffered.add_chunk(4000, link)
    a = derive_network_stages(per_token, link)
    b = derive_network_stages(buffered, link)
    assert a.nic_tx_seconds == pytest.approx(b.nic_tx_seconds)
    assert a.ethernet_serialize_seconds > 10 * b.ethernet_serialize_seconds
    assert per_token.small_chunks == 100 and buffered.small_chunks == 0


def test_a_large_write_with_a_short_last_segment_is_not_a_small_chunk() -> None:
    link = LinkModel()  # 1448-byte segments
    tally = ResponseTally()
    tally.add_chunk(link.mss_bytes + 12, link)  # one JSON response, two segments
    assert (tally.chunks, tally.packets) == (1, 2)
    assert tally.small_chunks == 0  # its 12-byte tail segment is not a tiny write


@given(mss=st.integers(1, 3000), small=st.integers(0, 200),
       sizes=st.lists(st.integers(0, 10_000), max_size=20))
def test_tally_counts_every_chunk_as_its_tcp_segments(mss: int, small: int,
                                                      sizes: list[int]) -> None:
    link = LinkModel(mss_bytes=mss, small_packet_payload_bytes=small)
    tally = ResponseTally()
    for size in sizes:
        tally.add_chunk(size, link)
    written = [size for size in sizes if size > 0]
    segments = [math.ceil(size / mss) for size in written]
    assert tally.chunks == len(written)
    assert tally.payload_bytes == sum(written)
    assert tally.packets == sum(segments)
    assert tally.small_chunks == sum(1 for size in written if size < small)
    assert tally.overhead_bytes == sum(segments) * (IP_TCP_HEADER_BYTES + ETHERNET_FRAMING_BYTES)


def test_link_model_validation_names_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        LinkModel(link_bits_per_second=0).validate()
    assert info.value.key == "link_bits_per_second"
