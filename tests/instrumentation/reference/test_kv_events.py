"""The simulated engine's KV-cache events: what its cache records, and the agent's
receiver reading them as it reads vLLM's (real ZeroMQ sockets)."""

from __future__ import annotations

import time

from testkit.support.processes import free_port
from tokenpath import metric_names as mn
from tokenpath.agent.kv_index import CAUSE_COLD, CAUSE_EVICTED, CAUSE_ROUTED, KvTracker
from tokenpath.agent.kv_receiver import KvEventReceiver, parse_kv_endpoint
from tokenpath.agent.kv_wire import Removed, Stored, decode_batch
from tokenpath.agent.snapshot import Points
from tokenpath.instrumentation.reference.kv_cache import (
    KV_REMOVED,
    KV_STORED,
    PagedKVCache,
    block_hashes,
)
from tokenpath.instrumentation.reference.kv_events import KvEventPublisher, batch_payload

BLOCK = 4
WAIT_SECONDS = 10.0


def test_the_cache_records_stores_and_evictions_in_order() -> None:
    cache = PagedKVCache(num_blocks=2, block_tokens=BLOCK)
    assert cache.drain_events() == []  # nothing recorded before record_events
    cache.record_events()
    first = list(range(8))
    assert cache.allocate("a", first) is not None
    hashes = block_hashes(first, BLOCK)
    assert cache.drain_events() == [(KV_STORED, h) for h in hashes]
    cache.free("a")
    assert cache.allocate("b", list(range(100, 108))) is not None  # evicts both blocks
    events = cache.drain_events()
    assert [kind for kind, _ in events].count(KV_REMOVED) == 2
    assert {h for kind, h in events if kind == KV_REMOVED} == set(hashes)
    assert cache.drain_events() == []


def test_a_batch_decodes_as_a_vllm_batch() -> None:
    payload = batch_payload([(KV_STORED, 1), (KV_STORED, -2), (KV_REMOVED, 3),
                             (KV_STORED, 4)], BLOCK, 7.0)
    batch = decode_batch(payload)
    assert batch.ts == 7.0
    assert batch.events == (Stored((1, -2), BLOCK, 0, "GPU"), Removed((3,), 0, "GPU"),
                            Stored((4,), BLOCK, 0, "GPU"))


def test_the_agent_classifies_the_simulated_engines_blocks() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    tracker = KvTracker(models={"replica-0": "m", "replica-1": "m"})
    receiver = KvEventReceiver([parse_kv_endpoint(endpoint)], tracker)
    receiver.start()
    caches = {name: PagedKVCache(num_blocks=2, block_tokens=BLOCK)
              for name in ("replica-0", "replica-1")}
    publishers = {name: KvEventPublisher(endpoint, name, BLOCK) for name in caches}
    for cache in caches.values():
        cache.record_events()

    def run(name: str, seq: str, prompt: list[int]) -> None:
        cache = caches[name]
        assert cache.allocate(seq, prompt) is not None
        cache.free(seq)
        publishers[name].publish(cache.drain_events())

    def stored() -> dict[tuple[str, ...], float]:
        points: Points = {}
        tracker.add_to(points)
        return points.get(mn.KV_STORED_BLOCKS, {})

    def batches(name: str) -> float:
        points: Points = {}
        tracker.add_to(points)
        return points.get(mn.KV_EVENT_BATCHES, {}).get((name,), 0.0)

    try:
        deadline = time.monotonic() + WAIT_SECONDS
        for name, publisher in publishers.items():
            # PUB drops until the subscription reaches it: removals of a block never
            # stored (no stored-block count changes) until one arrives
            while not batches(name):
                assert time.monotonic() < deadline
                publisher.publish([(KV_REMOVED, -999)])
                time.sleep(0.02)
        shared = list(range(8))
        run("replica-0", "warm", shared)
        while stored().get(("replica-0", "m", CAUSE_COLD), 0.0) < 2:  # before replica-1's
            assert time.monotonic() < deadline, stored()
            time.sleep(0.01)
        run("replica-1", "a", shared)  # held on replica-0: routed
        run("replica-0", "b", list(range(50, 58)))  # replica-0 evicts the shared blocks
        run("replica-0", "c", shared)  # evicted
        # each replica publishes on its own socket: wait for both to be counted
        while (stored().get(("replica-0", "m", CAUSE_EVICTED), 0.0) < 2
               or stored().get(("replica-1", "m", CAUSE_ROUTED), 0.0) < 2):
            assert time.monotonic() < deadline, stored()
            time.sleep(0.01)
    finally:
        for publisher in publishers.values():
            publisher.close()
        receiver.shutdown()
    blocks = stored()
    assert blocks[("replica-0", "m", CAUSE_COLD)] == 4
    assert blocks[("replica-1", "m", CAUSE_ROUTED)] == 2
