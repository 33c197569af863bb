"""Decoding the KV-cache event batches vLLM and SGLang publish over ZeroMQ.

Both engines send multipart messages ``(topic, sequence, payload)``: ``sequence`` is an
8-byte big-endian counter from 0 per publisher, ``payload`` one msgpack-encoded batch
``(ts, events, data-parallel rank)``. The events are ``BlockStored``, ``BlockRemoved`` and
``AllBlocksCleared``, tagged by their class name. The two engines encode them differently:

- vLLM: each event is a map whose ``type`` key names it, with ``block_hashes`` (bytes, or
  64-bit integers with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``), ``parent_block_hash``,
  ``token_ids``, ``block_size``, ``lora_id``, ``medium``, ``lora_name`` and optional
  ``extra_keys``, ``group_idx`` and newer fields; the batch is an array or a map,
  depending on the version;
- SGLang: each event is an array whose first element is the tag, then the fields in
  order (``block_hashes`` as integers, ``parent_block_hash``, ``token_ids``,
  ``block_size``, ``lora_id``, then whatever later versions append), in an array batch.

The decoder keeps only what the index needs: block hashes, block size, group and medium.
``token_ids``, ``extra_keys``, LoRA and session fields are never turned into Python
objects: a map field the structs below do not name is skipped by msgspec while parsing,
and SGLang's positional ``token_ids`` is kept as a :class:`msgspec.Raw` view of the
payload (no integers built) and dropped with the decoded struct. Decoding is linear in
the payload's size; a payload that fits no form raises :class:`KvDecodeError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import msgspec

BlockHash = bytes | int

MSGPACK_MAP_FIRST_BYTES: Final = frozenset({*range(0x80, 0x90), 0xDE, 0xDF})
STORED: Final = "BlockStored"
REMOVED: Final = "BlockRemoved"
CLEARED: Final = "AllBlocksCleared"
SEQUENCE_BYTES: Final = 8
# The medium an event names when it names none (SGLang's, vLLM's before it had one).
MEDIUM_GPU: Final = "GPU"


class KvDecodeError(ValueError):
    """A payload that is not a KV-event batch of any known form."""


# --- vLLM: events as tagged maps. Fields not named here (token_ids, extra_keys, lora
# fields, session and ownership fields) are skipped while parsing.
class _MapStored(msgspec.Struct, tag=STORED, gc=False):
    block_hashes: list[BlockHash]
    block_size: int
    medium: str | None = None
    group_idx: int | None = None


class _MapRemoved(msgspec.Struct, tag=REMOVED, gc=False):
    block_hashes: list[BlockHash]
    medium: str | None = None
    group_idx: int | None = None


class _MapCleared(msgspec.Struct, tag=CLEARED, gc=False):
    pass


_MapEvent = _MapStored | _MapRemoved | _MapCleared


# --- SGLang: events as tagged arrays; fields after block_size are not read (trailing
# array items beyond a struct's fields are skipped).
class _ArrayStored(msgspec.Struct, tag=STORED, array_like=True, gc=False):
    block_hashes: list[BlockHash]
    parent_block_hash: msgspec.Raw
    token_ids: msgspec.Raw  # a view of the payload bytes: no token id is decoded
    block_size: int


class _ArrayRemoved(msgspec.Struct, tag=REMOVED, array_like=True, gc=False):
    block_hashes: list[BlockHash]


class _ArrayCleared(msgspec.Struct, tag=CLEARED, array_like=True, gc=False):
    pass


_ArrayEvent = _ArrayStored | _ArrayRemoved | _ArrayCleared


class _ArrayBatchMapEvents(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_MapEvent]


class _ArrayBatchArrayEvents(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_ArrayEvent]


class _MapBatchMapEvents(msgspec.Struct, gc=False):
    ts: float
    events: list[_MapEvent]


class _MapBatchArrayEvents(msgspec.Struct, gc=False):
    ts: float
    events: list[_ArrayEvent]


@dataclass(frozen=True, slots=True)
class Stored:
    """Full blocks an engine stored (computed, or loaded, into ``medium``)."""

    hashes: tuple[BlockHash, ...]
    block_size: int
    group: int
    medium: str


@dataclass(frozen=True, slots=True)
class Removed:
    hashes: tuple[BlockHash, ...]
    group: int
    medium: str


@dataclass(frozen=True, slots=True)
class Cleared:
    pass


KvEvent = Stored | Removed | Cleared
CLEARED_EVENT: Final = Cleared()


@dataclass(frozen=True, slots=True)
class KvBatch:
    ts: float
    events: tuple[KvEvent, ...]


_MAP_BATCH: Final = (msgspec.msgpack.Decoder(_MapBatchMapEvents),
                     msgspec.msgpack.Decoder(_MapBatchArrayEvents))
_ARRAY_BATCH: Final = (msgspec.msgpack.Decoder(_ArrayBatchMapEvents),
                       msgspec.msgpack.Decoder(_ArrayBatchArrayEvents))


def _event(raw: object) -> KvEvent:
    if isinstance(raw, _MapStored):
        return Stored(tuple(raw.block_hashes), raw.block_size, raw.group_idx or 0,
                      raw.medium or MEDIUM_GPU)
    if isinstance(raw, _ArrayStored):
        return Stored(tuple(raw.block_hashes), raw.block_size, 0, MEDIUM_GPU)
    if isinstance(raw, _MapRemoved):
        return Removed(tuple(raw.block_hashes), raw.group_idx or 0, raw.medium or MEDIUM_GPU)
    if isinstance(raw, _ArrayRemoved):
        return Removed(tuple(raw.block_hashes), 0, MEDIUM_GPU)
    return CLEARED_EVENT


def decode_batch(payload: bytes) -> KvBatch:
    """One batch's events, in order. Tries the event form that fits the batch's first
    decoded shape: at most two linear passes over ``payload``."""
    if not payload:
        raise KvDecodeError("empty payload")
    decoders = _MAP_BATCH if payload[0] in MSGPACK_MAP_FIRST_BYTES else _ARRAY_BATCH
    error: Exception | None = None
    for decoder in decoders:
        try:
            batch = decoder.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            error = exc
            continue
        for event in batch.events:
            if isinstance(event, _MapStored | _ArrayStored) and event.block_size <= 0:
                raise KvDecodeError(f"block_size must be positive, got {event.block_size}")
        return KvBatch(batch.ts, tuple(_event(event) for event in batch.events))
    raise KvDecodeError(str(error))


def decode_sequence(frame: bytes) -> int:
    """The publisher's batch counter (8 bytes, big-endian, signed: -1 ends a replay)."""
    if len(frame) != SEQUENCE_BYTES:
        raise KvDecodeError(f"sequence frame of {len(frame)} bytes, expected {SEQUENCE_BYTES}")
    return int.from_bytes(frame, "big", signed=True)
