"""OTLP/HTTP gzip bodies: every member read, a cut or corrupt stream refused, caps kept."""

from __future__ import annotations

import gzip
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenpath.collector.receivers.http import MAX_GZIP_MEMBERS, _BodyError, gunzip

CAP = 1 << 20


def _status(body: bytes, cap: int = CAP) -> int:
    with pytest.raises(_BodyError) as info:
        gunzip(body, cap)
    return info.value.status


@given(st.lists(st.binary(max_size=2000), min_size=1, max_size=4))
def test_every_member_of_a_multi_member_body_is_read(parts: list[bytes]) -> None:
    body = b"".join(gzip.compress(part) for part in parts)
    assert gunzip(body, CAP) == gzip.decompress(body) == b"".join(parts)


def test_zero_padding_after_a_member_is_skipped_as_gzip_does() -> None:
    body = gzip.compress(b"spans") + b"\x00" * 8
    assert gunzip(body, CAP) == gzip.decompress(body) == b"spans"


def test_a_stream_cut_short_is_refused() -> None:
    whole = gzip.compress(b"a" * 5000 + bytes(range(256)) * 40)
    assert _status(whole[:-8]) == 400  # no CRC and length trailer
    assert _status(whole[: len(whole) // 2]) == 400
    # Cut at a flush point: the bytes so far inflate cleanly, but the stream never ends.
    deflate = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    head = deflate.compress(b"first request") + deflate.flush(zlib.Z_FULL_FLUSH)
    assert _status(head) == 400


def test_bytes_after_a_member_that_are_no_member_are_refused() -> None:
    assert _status(gzip.compress(b"spans") + b"garbage") == 400
    assert _status(b"\x1f\x8b not gzip") == 400


def test_the_decompressed_cap_counts_every_member() -> None:
    member = gzip.compress(b"\x00" * 600)
    assert gunzip(member, 1200) == b"\x00" * 600
    assert gunzip(member * 2, 1200) == b"\x00" * 1200
    assert _status(member * 3, 1200) == 413


def test_a_body_of_more_members_than_the_cap_is_refused_before_inflating_them_all() -> None:
    empty = gzip.compress(b"")
    assert gunzip(empty * MAX_GZIP_MEMBERS, CAP) == b""
    # Thousands of tiny members would each copy the rest of the body: quadratic.
    assert _status(empty * 200_000) == 400
