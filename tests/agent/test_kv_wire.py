"""Decoding vLLM's and SGLang's KV-event batches (shapes from their sources)."""

from __future__ import annotations

import contextlib

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testkit.fakes.kv_events import (
    block_hash,
    sglang_batch,
    sglang_cleared,
    sglang_removed,
    sglang_stored,
    vllm_batch,
    vllm_cleared,
    vllm_removed,
    vllm_stored,
)
from tokenpath.agent.kv_wire import (
    MEDIUM_GPU,
    Cleared,
    KvDecodeError,
    Removed,
    Stored,
    decode_batch,
    decode_sequence,
)


def test_vllm_batch_decodes_to_hashes_size_group_and_medium() -> None:
    payload = vllm_batch(12.5, [
        vllm_stored([block_hash(1), block_hash(2)], parent=block_hash(0), group_idx=1,
                    kv_cache_spec_kind="full_attention", locality="LOCAL",
                    session_id="session-7", extra_keys=[None, ("salt",)]),
        vllm_removed([block_hash(1)], medium="CPU", group_idx=1),
        vllm_cleared(),
    ])
    batch = decode_batch(payload)
    assert batch.ts == 12.5
    assert batch.events == (
        Stored((block_hash(1), block_hash(2)), 32, 1, "GPU"),
        Removed((block_hash(1),), 1, "CPU"),
        Cleared(),
    )


def test_vllm_integer_hashes_and_a_missing_medium() -> None:
    batch = decode_batch(vllm_batch(1.0, [vllm_stored([5, 2**64 - 1], medium=None)]))
    assert batch.events == (Stored((5, 2**64 - 1), 32, 0, MEDIUM_GPU),)


def test_vllm_map_batch_of_older_versions_decodes_too() -> None:
    payload = msgspec.msgpack.encode({"ts": 3.0, "events": [vllm_stored([block_hash(9)])],
                                      "data_parallel_rank": 0})
    assert decode_batch(payload).events == (Stored((block_hash(9),), 32, 0, "GPU"),)


def test_sglang_batch_decodes_alike() -> None:
    payload = sglang_batch(4.0, [sglang_stored([11, 12], block_size=16, parent=10),
                                 sglang_removed([11]), sglang_cleared()], rank=0)
    assert decode_batch(payload).events == (
        Stored((11, 12), 16, 0, MEDIUM_GPU), Removed((11,), 0, MEDIUM_GPU), Cleared())


def test_sglang_events_with_fields_appended_by_later_versions() -> None:
    stored = [*sglang_stored([3]), "GPU", "extra"]
    assert decode_batch(sglang_batch(1.0, [stored])).events == (
        Stored((3,), 16, 0, MEDIUM_GPU),)


def test_token_ids_are_not_kept_on_decoded_events() -> None:
    batch = decode_batch(vllm_batch(1.0, [vllm_stored([block_hash(1)])]))
    event = batch.events[0]
    assert not hasattr(event, "token_ids")
    assert set(Stored.__slots__) == {"hashes", "block_size", "group", "medium"}


@pytest.mark.parametrize("payload", [
    b"",
    b"\xc1",  # never used in msgpack
    msgspec.msgpack.encode([1.0]),
    msgspec.msgpack.encode([1.0, [{"type": "BlockMoved", "block_hashes": []}]]),
    msgspec.msgpack.encode([1.0, [["BlockStored", [1]]]]),  # fields missing
    msgspec.msgpack.encode([1.0, [vllm_stored([b"x"], block_size=0)]]),
    msgspec.msgpack.encode([1.0, [vllm_stored([1.5])]]),  # a float is no hash
    msgspec.msgpack.encode({"events": []}),
    msgspec.msgpack.encode("text"),
])
def test_payloads_that_are_no_batch_raise_kv_decode_error(payload: bytes) -> None:
    with pytest.raises(KvDecodeError):
        decode_batch(payload)


def test_truncated_batches_raise_kv_decode_error_at_every_cut() -> None:
    payload = vllm_batch(1.0, [vllm_stored([block_hash(n) for n in range(4)]),
                               vllm_removed([block_hash(1)])])
    for cut in range(len(payload)):
        with pytest.raises(KvDecodeError):
            decode_batch(payload[:cut])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=256))
def test_fuzzed_bytes_decode_or_raise_kv_decode_error(data: bytes) -> None:
    with contextlib.suppress(KvDecodeError):
        decode_batch(data)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 200), st.integers(0, 255))
def test_one_flipped_byte_decodes_or_raises_kv_decode_error(position: int, value: int) -> None:
    payload = bytearray(sglang_batch(1.0, [sglang_stored([1, 2, 3]), sglang_removed([2])]))
    payload[position % len(payload)] = value
    with contextlib.suppress(KvDecodeError):
        decode_batch(bytes(payload))


def test_sequence_frames() -> None:
    assert decode_sequence((7).to_bytes(8, "big")) == 7
    assert decode_sequence((-1).to_bytes(8, "big", signed=True)) == -1
    with pytest.raises(KvDecodeError):
        decode_sequence(b"\x00" * 4)
