"""The simulated engine's KV-cache events, published as vLLM publishes them.

A vLLM engine started with ``--kv-events-config '{"publisher": "zmq", "endpoint": ...,
"topic": ...}'`` connects a ZeroMQ PUB socket to the endpoint and sends, per scheduler
step that changed its cache, one multipart message ``(topic, sequence, payload)``: the
sequence an 8-byte big-endian counter from 0, the payload a msgpack array ``[ts, events,
data_parallel_rank]`` whose events are maps tagged by ``type`` (``BlockStored`` with
``block_hashes``, ``parent_block_hash``, ``token_ids``, ``block_size``, ``lora_id``,
``medium``, ``lora_name``; ``BlockRemoved`` with ``block_hashes`` and ``medium``).
:class:`KvEventPublisher` does the same for the simulated engine, so the node agent's
receiver (``tokenpath agent --kv-events``) sees the demo's engines as it sees vLLM's.
The simulated cache keeps no token ids: ``token_ids`` is sent empty.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

import msgspec
import zmq

from tokenpath.instrumentation.reference.kv_cache import KV_STORED, KvCacheEvent

MEDIUM_GPU: Final = "GPU"
SEND_HWM: Final = 10_000


def _event(kind: str, hashes: list[int], block_size: int) -> dict[str, Any]:
    if kind == KV_STORED:
        return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None,
                "token_ids": [], "block_size": block_size, "lora_id": None,
                "medium": MEDIUM_GPU, "lora_name": None}
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": MEDIUM_GPU}


def batch_payload(events: Sequence[KvCacheEvent], block_size: int, ts: float) -> bytes:
    """One batch: runs of stored or removed hashes become one event each, in order."""
    out: list[dict[str, Any]] = []
    for kind, run in itertools.groupby(events, key=lambda event: event[0]):
        out.append(_event(kind, [block_hash for _, block_hash in run], block_size))
    return msgspec.msgpack.encode([ts, out, 0])


class KvEventPublisher:
    """A PUB socket connected to ``endpoint``; :meth:`publish` sends one batch. Sends never
    block: past the high-water mark ZeroMQ drops, as vLLM's publisher does."""

    def __init__(self, endpoint: str, topic: str, block_size: int,
                 clock: Callable[[], float] = time.time) -> None:
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.PUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, SEND_HWM)
        self._socket.connect(endpoint)
        self._topic = topic.encode()
        self._block_size = block_size
        self._clock = clock
        self._sequence = itertools.count()

    def publish(self, events: Sequence[KvCacheEvent]) -> None:
        if not events:
            return
        payload = batch_payload(events, self._block_size, self._clock())
        seq = next(self._sequence)
        # A subscriber not keeping up loses the batch, as over any PUB socket.
        with contextlib.suppress(zmq.Again):
            self._socket.send_multipart((self._topic, seq.to_bytes(8, "big"), payload),
                                        zmq.NOBLOCK)

    def close(self) -> None:
        self._socket.close(linger=0)
        self._context.term()
