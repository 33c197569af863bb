"""The batching sender (collector/batch_sender.py) on its own; its users' tests
(test_forwarding.py, tests/collector/store/test_clickhouse.py) cover it over HTTP and
ClickHouse."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from tokenpath.collector.batch_sender import (
    DROP_CLOSED,
    DROP_RETRY_EXPIRED,
    BatchSender,
    Retry,
    SenderConfig,
)


class _Receiver:
    """Takes batches; refuses the first ``failures`` with a Retry-After of ``after``."""

    def __init__(self, failures: int = 0, after: float | None = None) -> None:
        self.failures = failures
        self.after = after
        self.batches: list[list[int]] = []
        self.dropped: list[tuple[str, list[int]]] = []
        self.gate = threading.Event()
        self.gate.set()

    def export(self, batch: list[int]) -> None:
        assert self.gate.wait(30)
        if self.failures:
            self.failures -= 1
            raise Retry("busy", self.after)
        self.batches.append(list(batch))

    def on_dropped(self, reason: str, items: Sequence[int]) -> None:
        self.dropped.append((reason, list(items)))


def _sender(receiver: _Receiver, **config: float) -> BatchSender[int, list[int]]:
    settings = {"max_queue": 100, "batch_size": 4, "max_retry_seconds": 60.0,
                "shutdown_seconds": 30.0, **config}
    return BatchSender("test", SenderConfig(**settings),  # type: ignore[arg-type]
                       list, receiver.export, receiver.on_dropped)


def test_flush_waits_for_what_was_handed_in() -> None:
    receiver = _Receiver()
    receiver.gate.clear()
    sender = _sender(receiver)
    sender.start()
    for i in range(10):
        sender.put(i)
    assert sender.flush(timeout=0.05) is False  # the receiver holds the first batch
    receiver.gate.set()
    assert sender.flush()
    assert [i for batch in receiver.batches for i in batch] == list(range(10))
    assert all(len(batch) <= 4 for batch in receiver.batches)
    sender.shutdown()
    sender.shutdown()  # idempotent
    sender.put(99)
    assert receiver.dropped == [(DROP_CLOSED, [99])]


def test_a_retry_after_is_waited_for_and_the_batch_is_sent_whole_as_prepared_once() -> None:
    receiver = _Receiver(failures=2, after=0.0)
    prepared: list[list[int]] = []

    def prepare(batch: list[int]) -> list[int]:
        prepared.append(list(batch))
        return list(batch)

    sender = BatchSender("test", SenderConfig(100, 4, 60.0, 30.0), prepare, receiver.export,
                         receiver.on_dropped)
    for i in range(3):
        sender.put(i)  # unstarted: sent on the caller's thread
    assert receiver.batches == [[0], [1], [2]]
    assert prepared == [[0], [1], [2]]  # the first batch was tried three times, made once
    assert receiver.dropped == []


def test_past_the_retry_time_the_batch_is_counted() -> None:
    receiver = _Receiver(failures=10**6)
    sender = _sender(receiver, max_retry_seconds=0.0)
    sender.put(7)
    assert receiver.dropped == [(DROP_RETRY_EXPIRED, [7])]
    sender.shutdown()


def test_periodic_work_runs_while_idle_and_between_batches() -> None:
    receiver = _Receiver()
    calls = threading.Semaphore(0)

    def periodic() -> float:
        calls.release()
        return 0.01  # seconds until it is due again

    sender = BatchSender("test", SenderConfig(100, 4, 60.0, 30.0), list, receiver.export,
                         receiver.on_dropped, periodic=periodic)
    sender.start()
    for _ in range(5):  # idle: it runs on its own schedule, no item needed
        assert calls.acquire(timeout=30)
    for i in range(6):
        sender.put(i)
    assert sender.flush()
    assert [i for batch in receiver.batches for i in batch] == list(range(6))
    sender.shutdown()


def test_without_a_shutdown_deadline_everything_queued_is_sent() -> None:
    receiver = _Receiver()
    receiver.gate.clear()
    sender = _sender(receiver, shutdown_seconds=float("inf"))
    sender.start()
    for i in range(10):
        sender.put(i)
    threading.Timer(0.2, receiver.gate.set).start()
    sender.shutdown()  # waits for the held batch and the rest (no OverflowError on inf)
    assert [i for batch in receiver.batches for i in batch] == list(range(10))
    assert receiver.dropped == []
