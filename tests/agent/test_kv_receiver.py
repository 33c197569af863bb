"""The KV-event receiver on real ZeroMQ sockets: topics, sequences, replay, bad input."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import msgspec
import pytest
import zmq

from testkit.fakes.kv_events import (
    KvPublisher,
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
from testkit.support.processes import free_port
from tokenpath import metric_names as mn
from tokenpath.agent.kv_index import (
    CAUSE_COLD,
    CAUSE_EVICTED,
    CAUSE_ROUTED,
    DROP_GAP,
    DROP_MALFORMED,
    DROP_UNDECODABLE,
    KvTracker,
)
from tokenpath.agent.kv_receiver import KvEndpoint, KvEventReceiver, parse_kv_endpoint
from tokenpath.agent.snapshot import Points
from tokenpath.config import ConfigError

WAIT_SECONDS = 10.0
PROBE = "probe"


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def series(tracker: KvTracker, spec: mn.MetricSpec) -> dict[tuple[str, ...], float]:
    points: Points = {}
    tracker.add_to(points)
    return points.get(spec, {})


def value(tracker: KvTracker, spec: mn.MetricSpec, *labels: str) -> float:
    return series(tracker, spec).get(labels, 0.0)


def batches(tracker: KvTracker, engine: str) -> float:
    return value(tracker, mn.KV_EVENT_BATCHES, engine)


def connect(publisher: KvPublisher, tracker: KvTracker) -> None:
    """Sends probes on another topic until one arrives: PUB drops what it sends before
    the subscription reaches it."""
    before = batches(tracker, PROBE)

    def arrived() -> bool:
        publisher.send_frames((PROBE.encode(), (0).to_bytes(8, "big"), vllm_batch(0.0, [])))
        return batches(tracker, PROBE) > before
    wait_for(arrived, "the publisher's connection")


@pytest.fixture
def endpoint() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


@pytest.fixture
def tracker() -> KvTracker:
    return KvTracker(models={"engine-a": "m", "engine-b": "m"})


@pytest.fixture
def receiver(endpoint: str, tracker: KvTracker) -> Iterator[KvEventReceiver]:
    receiver = KvEventReceiver([parse_kv_endpoint(endpoint)], tracker)
    receiver.start()
    yield receiver
    receiver.shutdown()


def test_endpoints_parse_with_and_without_an_engine_id() -> None:
    assert parse_kv_endpoint("tcp://127.0.0.1:5557") == KvEndpoint("tcp://127.0.0.1:5557")
    assert parse_kv_endpoint("vllm-0=tcp://10.0.0.1:5557") == KvEndpoint(
        "tcp://10.0.0.1:5557", "vllm-0")
    assert parse_kv_endpoint("tcp://127.0.0.1:5557").label == "127.0.0.1:5557"


@pytest.mark.parametrize("bad", ["127.0.0.1:5557", "http://h:1", "tcp://h", "tcp://h:99999",
                                 "=tcp://h:1", "tcp://h:1/x", "ipc:///tmp/x"])
def test_bad_endpoints_are_config_errors_naming_the_key(bad: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_kv_endpoint(bad)
    assert error.value.key == "kv_events"


def test_engines_sharing_an_endpoint_are_told_apart_by_topic(
        endpoint: str, tracker: KvTracker, receiver: KvEventReceiver) -> None:
    assert receiver.bound[endpoint] is True
    a, b = KvPublisher(endpoint, "engine-a"), KvPublisher(endpoint, "engine-b")
    try:
        connect(a, tracker)
        connect(b, tracker)
        a.publish(vllm_batch(1.0, [vllm_stored([block_hash(1), block_hash(2)])]))
        wait_for(lambda: batches(tracker, "engine-a") == 1, "engine-a's batch")
        b.publish(vllm_batch(2.0, [vllm_stored([block_hash(1), block_hash(3)])]))
        wait_for(lambda: batches(tracker, "engine-b") == 1, "engine-b's batch")
    finally:
        a.close()
        b.close()
    stored = series(tracker, mn.KV_STORED_BLOCKS)
    assert stored[("engine-a", "m", CAUSE_COLD)] == 2
    assert stored[("engine-b", "m", CAUSE_ROUTED)] == 1
    assert stored[("engine-b", "m", CAUSE_COLD)] == 1


def test_a_sequence_gap_is_counted_and_a_restart_resets_the_index(
        endpoint: str, tracker: KvTracker, receiver: KvEventReceiver) -> None:
    engine = "engine-a"
    publisher = KvPublisher(endpoint, engine)
    try:
        connect(publisher, tracker)
        publisher.publish(vllm_batch(1.0, [vllm_stored([block_hash(1)])]))
        publisher.publish(vllm_batch(2.0, [vllm_stored([block_hash(2)])]), deliver=False)
        publisher.publish(vllm_batch(3.0, [vllm_stored([block_hash(3)])]), deliver=False)
        publisher.publish(vllm_batch(4.0, [vllm_removed([block_hash(1)])]))
        wait_for(lambda: batches(tracker, engine) == 2, "two batches")
    finally:
        publisher.close()
    assert value(tracker, mn.KV_EVENTS_DROPPED, engine, DROP_GAP) == 2
    restarted = KvPublisher(endpoint, engine)  # a new process numbers from 0 again
    try:
        connect(restarted, tracker)
        restarted.publish(vllm_batch(5.0, [vllm_stored([block_hash(1)])]))
        wait_for(lambda: batches(tracker, engine) == 3, "the restarted engine's batch")
    finally:
        restarted.close()
    assert value(tracker, mn.KV_INDEX_RESETS, engine, "m") == 1
    # The removal before the restart is forgotten with the index: cold, not evicted.
    assert value(tracker, mn.KV_STORED_BLOCKS, engine, "m", CAUSE_COLD) == 2
    assert value(tracker, mn.KV_STORED_BLOCKS, engine, "m", CAUSE_EVICTED) == 0


def test_the_replay_endpoint_fills_a_gap(endpoint: str, tracker: KvTracker) -> None:
    replay = f"tcp://127.0.0.1:{free_port()}"
    receiver = KvEventReceiver([parse_kv_endpoint(endpoint)], tracker,
                               replay={"engine-a": replay})
    receiver.start()
    publisher = KvPublisher(endpoint, "engine-a", replay=replay)
    try:
        connect(publisher, tracker)
        publisher.publish(vllm_batch(1.0, [vllm_stored([block_hash(1)])]))
        publisher.publish(vllm_batch(2.0, [vllm_removed([block_hash(1)])]), deliver=False)
        publisher.publish(vllm_batch(3.0, [vllm_stored([block_hash(1)])]))
        wait_for(lambda: batches(tracker, "engine-a") == 3, "three batches")
    finally:
        publisher.close()
        receiver.shutdown()
    assert value(tracker, mn.KV_EVENTS_DROPPED, "engine-a", DROP_GAP) == 0
    assert value(tracker, mn.KV_STORED_BLOCKS, "engine-a", "m", CAUSE_EVICTED) == 1


def test_an_agent_that_joins_late_catches_up_from_the_replay_endpoint(
        endpoint: str, tracker: KvTracker) -> None:
    replay = f"tcp://127.0.0.1:{free_port()}"
    receiver = KvEventReceiver([parse_kv_endpoint(endpoint)], tracker,
                               replay={"engine-a": replay})
    receiver.start()
    publisher = KvPublisher(endpoint, "engine-a", replay=replay)
    try:
        publisher.publish(vllm_batch(1.0, [vllm_stored([block_hash(1)])]), deliver=False)
        connect(publisher, tracker)
        publisher.publish(vllm_batch(2.0, [vllm_stored([block_hash(1)])]))
        wait_for(lambda: batches(tracker, "engine-a") == 2, "both batches")
    finally:
        publisher.close()
        receiver.shutdown()
    stored = series(tracker, mn.KV_STORED_BLOCKS)
    assert stored[("engine-a", "m", CAUSE_COLD)] == 1
    assert stored[("engine-a", "m", "already_held")] == 1


def test_bad_messages_are_counted_and_the_receiver_keeps_running(
        endpoint: str, tracker: KvTracker, receiver: KvEventReceiver) -> None:
    engine = "engine-a"
    publisher = KvPublisher(endpoint, engine)
    try:
        connect(publisher, tracker)
        good = vllm_batch(1.0, [vllm_stored([block_hash(1), block_hash(2)])])
        publisher.send_frames((b"engine-a", good))  # two frames
        publisher.send_frames((b"engine-a", b"\x00\x01", good))  # short sequence
        publisher.send_frames((b"\xff\xfe", (0).to_bytes(8, "big"), good))  # topic not UTF-8
        publisher.publish(good[: len(good) // 2])  # truncated
        publisher.publish(b"\xc1" * 64)  # fuzz
        publisher.publish(msgspec.msgpack.encode({"ts": "x", "events": 3}))
        publisher.publish(sglang_batch(2.0, [sglang_stored([5, 6])]))
        wait_for(lambda: value(tracker, mn.KV_STORED_BLOCKS, engine, "m", CAUSE_COLD) == 2,
                 "the good batch after the bad ones")
    finally:
        publisher.close()
    assert value(tracker, mn.KV_EVENTS_DROPPED, engine, DROP_UNDECODABLE) == 3
    assert value(tracker, mn.KV_EVENTS_DROPPED, engine, DROP_MALFORMED) == 1
    # Without a readable topic, the message counts against the endpoint.
    assert value(tracker, mn.KV_EVENTS_DROPPED, endpoint.removeprefix("tcp://"),
                 DROP_MALFORMED) == 2


def test_an_engine_id_names_the_endpoint_whatever_the_topic(endpoint: str,
                                                            tracker: KvTracker) -> None:
    receiver = KvEventReceiver([parse_kv_endpoint(f"engine-b={endpoint}")], tracker)
    receiver.start()
    publisher = KvPublisher(endpoint, "")
    try:
        def arrived() -> bool:
            publisher.send_frames((b"", (0).to_bytes(8, "big"), vllm_batch(0.0, [])))
            return batches(tracker, "engine-b") > 0
        wait_for(arrived, "the connection")
    finally:
        publisher.close()
        receiver.shutdown()


def test_the_agent_connects_to_an_engine_that_binds(tracker: KvTracker) -> None:
    port = free_port()
    context = zmq.Context()
    pub = context.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(f"tcp://127.0.0.1:{port}")  # the engine binds (vLLM: tcp://*:PORT)
    receiver = KvEventReceiver([parse_kv_endpoint(f"engine-a=tcp://127.0.0.1:{port}")],
                               tracker)
    receiver.start()
    try:
        assert receiver.bound[f"tcp://127.0.0.1:{port}"] is False

        def arrived() -> bool:
            pub.send_multipart((b"", (0).to_bytes(8, "big"),
                                vllm_batch(1.0, [vllm_cleared()])))
            return batches(tracker, "engine-a") > 0
        wait_for(arrived, "the connection")
    finally:
        receiver.shutdown()
        pub.close(linger=0)
        context.term()


def _scenario(form: str) -> dict[tuple[str, ...], float]:
    """One engine stores, evicts and re-stores, a second takes the same prefix: in vLLM's
    batch form or SGLang's, through the receiver's message handling."""
    tracker = KvTracker(models={"engine-a": "m", "engine-b": "m"})
    receiver = KvEventReceiver([], tracker)
    endpoint = KvEndpoint("tcp://127.0.0.1:1")

    def stored(*hashes: int) -> object:
        if form == "vllm":
            return vllm_stored([block_hash(h) for h in hashes], block_size=16)
        return sglang_stored(list(hashes), block_size=16)

    def removed(*hashes: int) -> object:
        return (vllm_removed([block_hash(h) for h in hashes]) if form == "vllm"
                else sglang_removed(list(hashes)))

    encode = vllm_batch if form == "vllm" else sglang_batch
    stream = [("engine-a", [stored(1, 2, 3)]), ("engine-a", [removed(1, 2)]),
              ("engine-b", [stored(1, 2, 3)]), ("engine-a", [stored(1, 2), stored(3)]),
              ("engine-a", [sglang_cleared() if form == "sglang" else vllm_cleared()]),
              ("engine-a", [stored(1)])]
    sequence = {"engine-a": 0, "engine-b": 0}
    for n, (engine, events) in enumerate(stream):
        seq = sequence[engine]
        sequence[engine] += 1
        receiver.handle(endpoint, (engine.encode(), seq.to_bytes(8, "big"),
                                   encode(float(n), events)))  # type: ignore[arg-type]
    return series(tracker, mn.KV_STORED_BLOCKS)


def test_sglang_streams_are_decoded_and_classified_as_vllm_streams_are() -> None:
    vllm, sglang = _scenario("vllm"), _scenario("sglang")
    assert vllm == sglang
    assert vllm[("engine-a", "m", CAUSE_COLD)] == 3
    assert vllm[("engine-a", "m", CAUSE_EVICTED)] == 2
    # after the clear, engine-a forgot its blocks: 1 is engine-b's, so routed
    assert vllm[("engine-a", "m", CAUSE_ROUTED)] == 1
    assert vllm[("engine-a", "m", "already_held")] == 1
    assert vllm[("engine-b", "m", CAUSE_ROUTED)] == 1  # only 3 was held on engine-a
    assert vllm[("engine-b", "m", CAUSE_COLD)] == 2
