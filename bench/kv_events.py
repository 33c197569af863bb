"""The agent's KV-event receiver: CPU per event and memory at 1M resident blocks.

- ``cpu``: vLLM-shaped batches (16 stored blocks of 32 tokens each, with their token ids,
  then removals of older blocks, as an engine under steady eviction sends them) go
  through :meth:`KvEventReceiver.handle` (sequence check, msgspec decode, classification
  across two engines of one model), against the floor of decoding the same payloads
  with msgspec alone into the engine's full event structs (token ids included). Figures:
  CPU microseconds per block event (stored or removed) and per batch, and the ratio to
  the decode floor. Rounds alternate receiver and floor; the median is reported.
- ``memory``: one engine's index grown to ``blocks`` resident blocks (32-byte hashes,
  64 a batch): the growth of this process's RSS (and the CPU per block of that fill),
  then, filled again under tracemalloc, the bytes the index holds per resident block.

``python -m bench.kv_events [--blocks 1000000]`` prints the result as JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
import tracemalloc
from typing import Any

import msgspec
import psutil

from testkit.fakes.kv_events import block_hash, vllm_batch, vllm_removed, vllm_stored
from tokenpath.agent.kv_index import KvTracker
from tokenpath.agent.kv_receiver import KvEndpoint, KvEventReceiver

BLOCK_SIZE = 32
BLOCKS_PER_BATCH = 16
BATCHES = 2_000
ROUNDS = 5
RESIDENT_BLOCKS = 1_000_000
MEMORY_BATCH = 64
ENGINES = ("engine-a", "engine-b")


class _FullStored(msgspec.Struct, tag="BlockStored"):
    """The engine's own BlockStored, every field decoded: the floor to compare with."""

    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class _FullRemoved(msgspec.Struct, tag="BlockRemoved"):
    block_hashes: list[bytes | int]
    medium: str | None


class _FullBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[_FullStored | _FullRemoved]
    data_parallel_rank: int | None = None


def _payloads(batches: int) -> list[bytes]:
    """Each batch stores 16 new blocks and removes the 16 stored 8 batches before; every
    third batch re-stores blocks the other engine holds (routed)."""
    payloads = []
    for n in range(batches):
        first = n * BLOCKS_PER_BATCH
        hashes = [block_hash(first + i) for i in range(BLOCKS_PER_BATCH)]
        if n % 3 == 2:
            hashes[: BLOCKS_PER_BATCH // 2] = [block_hash(first - BLOCKS_PER_BATCH + i)
                                               for i in range(BLOCKS_PER_BATCH // 2)]
        events = [vllm_stored(hashes, parent=hashes[0], block_size=BLOCK_SIZE)]
        if n >= 8:
            old = (n - 8) * BLOCKS_PER_BATCH
            events.append(vllm_removed([block_hash(old + i) for i in range(BLOCKS_PER_BATCH)]))
        payloads.append(vllm_batch(float(n), events))
    return payloads


def _receiver_seconds(payloads: list[bytes]) -> float:
    receiver = KvEventReceiver([KvEndpoint("tcp://127.0.0.1:1")], KvTracker())
    endpoint = KvEndpoint("tcp://127.0.0.1:1")
    frames = [((ENGINES[n % 2].encode(), (n // 2).to_bytes(8, "big"), payload))
              for n, payload in enumerate(payloads)]
    start = time.process_time()
    for message in frames:
        receiver.handle(endpoint, message)
    return time.process_time() - start


def _floor_seconds(payloads: list[bytes]) -> float:
    decoder = msgspec.msgpack.Decoder(_FullBatch)
    start = time.process_time()
    for payload in payloads:
        decoder.decode(payload)
    return time.process_time() - start


def measure_cpu(batches: int = BATCHES, rounds: int = ROUNDS) -> dict[str, Any]:
    payloads = _payloads(batches)
    block_events = sum(BLOCKS_PER_BATCH * (2 if n >= 8 else 1) for n in range(batches))
    receiver, floor = [], []
    for _ in range(rounds):
        gc.collect()
        receiver.append(_receiver_seconds(payloads))
        floor.append(_floor_seconds(payloads))
    seconds, floor_seconds = statistics.median(receiver), statistics.median(floor)
    return {
        "batches": batches, "block_events": block_events,
        "cpu_us_per_block_event": seconds / block_events * 1e6,
        "cpu_us_per_batch": seconds / batches * 1e6,
        "decode_floor_us_per_block_event": floor_seconds / block_events * 1e6,
        "ratio_to_decode_floor": seconds / floor_seconds if floor_seconds else None,
    }


def _fill(blocks: int) -> KvTracker:
    from tokenpath.agent.kv_wire import decode_batch

    tracker = KvTracker(max_blocks=blocks)
    for first in range(0, blocks, MEMORY_BATCH):
        count = min(MEMORY_BATCH, blocks - first)
        payload = vllm_batch(1.0, [vllm_stored([block_hash(first + i) for i in range(count)],
                                               token_ids=[], block_size=BLOCK_SIZE)])
        tracker.apply(ENGINES[0], decode_batch(payload))
    return tracker


def measure_memory(blocks: int = RESIDENT_BLOCKS) -> dict[str, Any]:
    gc.collect()
    process = psutil.Process()
    rss_before = process.memory_info().rss
    started = time.process_time()
    tracker = _fill(blocks)
    seconds = time.process_time() - started
    gc.collect()
    rss_growth = process.memory_info().rss - rss_before
    resident = tracker.resident_blocks()
    del tracker
    gc.collect()
    tracemalloc.start()
    traced = _fill(blocks)
    gc.collect()
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert traced.resident_blocks() == resident
    return {
        "resident_blocks": resident,
        "bytes_per_resident_block": held / resident,
        "index_mib": held / 2**20,
        "rss_growth_mib": rss_growth / 2**20,
        "fill_cpu_us_per_block": seconds / resident * 1e6,
    }


def run(blocks: int = RESIDENT_BLOCKS, batches: int = BATCHES) -> dict[str, Any]:
    return {"cpu": measure_cpu(batches), "memory": measure_memory(blocks)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=RESIDENT_BLOCKS)
    parser.add_argument("--batches", type=int, default=BATCHES)
    args = parser.parse_args()
    print(json.dumps(run(args.blocks, args.batches), indent=2))


if __name__ == "__main__":
    main()
