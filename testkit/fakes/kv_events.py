"""KV-cache event batches as vLLM and SGLang put them on the wire, and a ZeroMQ publisher.

The shapes are those of the engines' sources (vLLM 0.32 ``vllm/distributed/kv_events.py``,
SGLang ``python/sglang/srt/disaggregation/kv_events.py``), written out as plain msgpack:

- vLLM: the batch is an array ``[ts, events, data_parallel_rank]``; each event a map whose
  ``type`` names it. ``BlockStored`` always carries ``block_hashes``, ``parent_block_hash``,
  ``token_ids``, ``block_size``, ``lora_id``, ``medium`` and ``lora_name`` (fields without
  a default), and the defaulted ones (``extra_keys``, ``group_idx``,
  ``kv_cache_spec_kind``, ``kv_cache_spec_sliding_window``, ``locality``, ``ownership``,
  ``session_id``) only when set (the structs omit defaults). Block hashes are 32-byte
  strings (or 64-bit integers with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``);
- SGLang: the batch is an array ``[ts, events]`` (newer versions append the attention DP
  rank); each event an array, its tag first: ``["BlockStored", block_hashes,
  parent_block_hash, token_ids, block_size, lora_id]``, ``["BlockRemoved",
  block_hashes]``, ``["AllBlocksCleared"]``, hashes as integers.

:class:`KvPublisher` sends ``(topic, sequence, payload)`` multipart messages from a real
PUB socket, and can serve replays from a real ROUTER socket as the engines do: a request
``(identity, b"", start)`` is answered with ``(identity, b"", sequence, payload)`` for every
buffered batch from ``start``, then ``(identity, b"", -1, b"")``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import msgspec
import zmq

Hash = bytes | int


def block_hash(n: int) -> bytes:
    """A 32-byte block hash, as vLLM's sha256-based hashes are."""
    return n.to_bytes(32, "big")


def vllm_stored(hashes: Sequence[Hash], *, token_ids: Sequence[int] | None = None,
                block_size: int = 32, parent: Hash | None = None, medium: str | None = "GPU",
                **defaulted: Any) -> dict[str, Any]:
    tokens = list(token_ids) if token_ids is not None else [7] * (block_size * len(hashes))
    event: dict[str, Any] = {
        "type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": parent,
        "token_ids": tokens, "block_size": block_size, "lora_id": None, "medium": medium,
        "lora_name": None}
    event.update({key: value for key, value in defaulted.items() if value is not None})
    return event


def vllm_removed(hashes: Sequence[Hash], *, medium: str | None = "GPU",
                 **defaulted: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "BlockRemoved", "block_hashes": list(hashes),
                             "medium": medium}
    event.update({key: value for key, value in defaulted.items() if value is not None})
    return event


def vllm_cleared() -> dict[str, Any]:
    return {"type": "AllBlocksCleared"}


def vllm_batch(ts: float, events: Sequence[dict[str, Any]], rank: int | None = 0) -> bytes:
    batch: list[Any] = [ts, list(events)]
    if rank is not None:
        batch.append(rank)
    return msgspec.msgpack.encode(batch)


def sglang_stored(hashes: Sequence[int], *, token_ids: Sequence[int] | None = None,
                  block_size: int = 16, parent: int | None = None) -> list[Any]:
    tokens = list(token_ids) if token_ids is not None else [7] * (block_size * len(hashes))
    return ["BlockStored", list(hashes), parent, tokens, block_size, None]


def sglang_removed(hashes: Sequence[int]) -> list[Any]:
    return ["BlockRemoved", list(hashes)]


def sglang_cleared() -> list[Any]:
    return ["AllBlocksCleared"]


def sglang_batch(ts: float, events: Sequence[list[Any]], rank: int | None = None) -> bytes:
    batch: list[Any] = [ts, list(events)]
    if rank is not None:
        batch.append(rank)
    return msgspec.msgpack.encode(batch)


class KvPublisher:
    """A PUB socket connected to ``endpoint`` that numbers its batches from 0, with an
    optional replay ROUTER bound at ``replay``; :meth:`close` releases both."""

    def __init__(self, endpoint: str, topic: str = "", *, replay: str | None = None) -> None:
        self._context = zmq.Context()
        self.pub = self._context.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.connect(endpoint)
        self.topic = topic.encode()
        self.seq = 0
        self.sent: list[tuple[int, bytes]] = []
        self._replay: zmq.Socket[bytes] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if replay is not None:
            self._replay = self._context.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.bind(replay)
            self._thread = threading.Thread(target=self._serve_replay, daemon=True)
            self._thread.start()

    def publish(self, payload: bytes, *, deliver: bool = True) -> int:
        """Number and keep ``payload``; send it unless ``deliver`` is false (a batch the
        subscriber misses)."""
        seq = self.seq
        self.seq += 1
        self.sent.append((seq, payload))
        if deliver:
            self.pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
        return seq

    def send_frames(self, frames: Sequence[bytes]) -> None:
        self.pub.send_multipart(list(frames))

    def _serve_replay(self) -> None:
        assert self._replay is not None
        while not self._stop.is_set():
            if not self._replay.poll(50):
                continue
            identity, _, start = self._replay.recv_multipart()
            first = int.from_bytes(start, "big")
            for seq, payload in list(self.sent):
                if seq >= first:
                    self._replay.send_multipart(
                        (identity, b"", seq.to_bytes(8, "big"), payload))
            self._replay.send_multipart(
                (identity, b"", (-1).to_bytes(8, "big", signed=True), b""))

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
        self._context.term()
