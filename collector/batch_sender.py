"""``BatchSender``: the one way tokenpath sends what it accepted to somewhere else.

The record forwarder (OTLP logs to the pricing collectors, collector/forwarder.py) and the
stores' writers (collector/store/sqlite.py, collector/store/clickhouse.py) hand their items
to a sender; the sender owns the rest, the way the OpenTelemetry SDK's ``BatchProcessor``
does for spans:

- a bounded queue (``max_queue`` items, counting the batch being sent). It never drops for
  want of room: a caller of :meth:`put` waits while it is full (back-pressure), and
  :meth:`backlog` tells admission (collector/backpressure.py) to refuse new data once it
  is half full;
- one thread takes batches of up to ``batch_size``, turns each into what is sent once
  (``prepare(batch)``: an encoded body, rows with their deduplication tokens), and calls
  ``export(prepared)`` with it, again on each retry. An export
  that raises :class:`Retry` is tried again after a backoff (doubling from
  ``INITIAL_BACKOFF_SECONDS``, at most ``MAX_BACKOFF_SECONDS``; ``Retry.after``, a
  ``Retry-After``, wins) until ``max_retry_seconds`` have passed; one that raises
  :class:`GiveUp` is not retried;
- a shutdown deadline: from :meth:`begin_shutdown` (or :meth:`shutdown`) the sender has
  ``shutdown_seconds`` to send what is queued; after it, a backoff is cut short and what
  is left is given up.

An owner with periodic work to do on the sender's thread (the SQLite store's retention
passes) passes ``periodic``: it is called before each batch is taken and whenever the
queue has stayed empty for the seconds it last returned; it must not raise.

Whatever is given up goes to ``on_dropped(reason, items)``, the owner's counter, with one
of the ``DROP_*`` reasons below; nothing is lost without it. Without a started thread
(tools, tests), :meth:`put` sends synchronously.

Thread contract: :meth:`put`, :meth:`flush`, :meth:`backlog` and :meth:`depth` may be
called from any thread; :meth:`start`, :meth:`begin_shutdown` and :meth:`shutdown` from the owner's;
``export`` and ``on_dropped`` run on the sender's thread (or the caller's, unstarted).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from tokenpath.collector.backpressure import Backlog, high_water

log = logging.getLogger(__name__)

T = TypeVar("T")
P = TypeVar("P")  # a batch as sent

INITIAL_BACKOFF_SECONDS = 0.5
MAX_BACKOFF_SECONDS = 30.0
# How long a caller waiting for room sleeps before it checks the sender and the deadline.
ROOM_WAIT_SECONDS = 1.0

# why items were given up (the owners' drop counters use these as their reason labels)
DROP_RETRY_EXPIRED = "retry_expired"  # retried for max_retry_seconds
DROP_REJECTED = "rejected"  # the receiver refused them for good
DROP_SHUTDOWN = "shutdown"  # still queued when the shutdown deadline ran out
DROP_QUEUE_FULL = "queue_full"  # made room, past the deadline or with the thread gone
DROP_CLOSED = "closed"  # handed in after shutdown


class Retry(Exception):
    """The export failed in a way worth trying again (a connection error, 429, 503);
    ``after`` is the receiver's ``Retry-After`` in seconds, if it sent one."""

    def __init__(self, message: str, after: float | None = None) -> None:
        super().__init__(message)
        self.after = after


class GiveUp(Exception):
    """The batch will never be taken (a 4xx other than 429): count it, do not retry."""

    def __init__(self, message: str, reason: str = DROP_REJECTED) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class SenderConfig:
    """The owner validates these under its own config keys."""

    max_queue: int
    batch_size: int
    max_retry_seconds: float
    shutdown_seconds: float


class BatchSender(Generic[T, P]):
    def __init__(self, name: str, config: SenderConfig,
                 prepare: Callable[[list[T]], P],
                 export: Callable[[P], None],
                 on_dropped: Callable[[str, Sequence[T]], None],
                 clock: Callable[[], float] = time.monotonic,
                 periodic: Callable[[], float] | None = None) -> None:
        self.name = name
        self._config = config
        self._prepare = prepare
        self._export = export
        self._on_dropped = on_dropped
        self._clock = clock
        self._periodic = periodic
        self._queue: deque[T] = deque()
        self._in_flight = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()  # wakes a backoff wait early
        self._closing = False
        self._closed = False
        self._abandoned = False
        self._deadline: float | None = None  # set by begin_shutdown()
        self._thread: threading.Thread | None = None

    # --- any thread ----------------------------------------------------------------------

    def put(self, item: T) -> None:
        """Queue one item; waits while the queue is full and the sender runs."""
        with self._cond:
            reason = DROP_CLOSED if self._closed else DROP_QUEUE_FULL
            if self._closed:
                dropped: list[T] = [item]
            else:
                dropped = []
                while self._full() and self._may_wait():
                    self._cond.wait(ROOM_WAIT_SECONDS)  # a sent batch makes room
                if self._full() and self._queue:  # no more waiting: the oldest makes room
                    dropped.append(self._queue.popleft())
                self._queue.append(item)
                self._cond.notify_all()
        if dropped:
            self._on_dropped(reason, dropped)
            return
        if self._thread is None:
            self._send_inline()

    def depth(self) -> int:
        """Items queued or being sent."""
        return len(self._queue) + self._in_flight

    def backlog(self) -> Backlog:
        """The queue as admission sees it: past half of ``max_queue`` the receivers shed
        load."""
        return Backlog(f"{self.name} queue", self.depth, high_water(self._config.max_queue))

    def _full(self) -> bool:
        return len(self._queue) + self._in_flight >= self._config.max_queue

    def _may_wait(self) -> bool:
        """Whether a caller may wait for room (lock held): while the sender runs and the
        shutdown deadline has not passed."""
        thread = self._thread
        if thread is None or not thread.is_alive() or self._abandoned:
            return False
        return self._deadline is None or self._clock() < self._deadline

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything handed in so far is sent or given up (the sender's
        thread does the work; unstarted, :meth:`put` already sent it). False when
        ``timeout`` seconds passed first."""
        deadline = None if timeout is None else self._clock() + timeout
        with self._cond:
            while self._queue or self._in_flight:
                thread = self._thread
                if thread is None or not thread.is_alive():
                    return False
                left = None if deadline is None else deadline - self._clock()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(ROOM_WAIT_SECONDS if left is None
                                else min(left, ROOM_WAIT_SECONDS))
        return True

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None or self._closed:
            return
        self._thread = threading.Thread(target=self._run, name=f"tokenpath-{self.name}",
                                        daemon=True)
        self._thread.start()

    def begin_shutdown(self) -> None:
        """The owner is stopping: from now on the deadline (``shutdown_seconds``) runs, for
        items still handed in and :meth:`shutdown` alike, so a receiver that takes nothing
        cannot hold the shutdown longer."""
        with self._cond:
            if self._deadline is None:
                self._deadline = self._clock() + self._config.shutdown_seconds
            self._cond.notify_all()

    def shutdown(self) -> None:
        """Send what is queued until the deadline; give up the rest. Idempotent."""
        self.begin_shutdown()
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify_all()
            assert self._deadline is not None
            left = max(0.0, self._deadline - self._clock())
        if self._thread is not None:
            self._thread.join(min(left, threading.TIMEOUT_MAX))  # no deadline: inf
            with self._cond:
                self._abandoned = True  # past the deadline: take no further batch
            self._stop.set()  # cut a backoff short
            self._thread.join()  # at most the export in progress
        else:
            self._send_inline()
        with self._cond:
            self._closed = True
            rest = list(self._queue)
            self._queue.clear()
        if rest:
            log.warning("%s: %d items not sent before the shutdown deadline", self.name,
                        len(rest))
            self._on_dropped(DROP_SHUTDOWN, rest)

    # --- the sender thread ---------------------------------------------------------------

    def _take(self, wait: bool, timeout: float | None = None) -> list[T] | None:
        """The next batch; [] when there is none to wait for (stopping), None when
        ``timeout`` seconds passed with the queue empty."""
        with self._cond:
            while wait and not self._queue and not self._closing:
                if timeout is None:
                    self._cond.wait()
                    continue
                self._cond.wait(timeout)
                if not self._queue and not self._closing:
                    return None
            if self._abandoned:
                return []
            n = min(len(self._queue), self._config.batch_size)
            batch = [self._queue.popleft() for _ in range(n)]
            self._in_flight = len(batch)
            return batch

    def _run(self) -> None:
        while True:
            wait = None if self._periodic is None else self._periodic()
            batch = self._take(wait=True, timeout=wait)
            if batch is None:  # idle for ``wait`` seconds: the periodic work is due
                continue
            if not batch:
                return
            self._send(batch)

    def _send_inline(self) -> None:
        while batch := self._take(wait=False):
            self._send(batch)

    def _send(self, batch: list[T]) -> None:
        deadline = self._clock() + self._config.max_retry_seconds
        backoff = INITIAL_BACKOFF_SECONDS
        try:
            prepared = self._prepare(batch)
            while True:
                try:
                    self._export(prepared)
                    return
                except GiveUp as exc:
                    log.error("%s: %d items refused: %s", self.name, len(batch), exc)
                    self._on_dropped(exc.reason, batch)
                    return
                except Retry as retry:
                    delay = retry.after if retry.after is not None else backoff
                    backoff = min(MAX_BACKOFF_SECONDS, backoff * 2)
                    if self._stop.is_set():  # the shutdown deadline passed
                        with self._cond:
                            self._queue.extendleft(reversed(batch))  # given up at shutdown
                        return
                    if self._clock() + delay > deadline:
                        log.warning("%s: gave up on %d items after retrying: %s", self.name,
                                    len(batch), retry)
                        self._on_dropped(DROP_RETRY_EXPIRED, batch)
                        return
                    log.warning("%s: %s; retrying in %.1f s", self.name, retry, delay)
                    self._stop.wait(delay)
        finally:
            with self._cond:
                self._in_flight = 0
                self._cond.notify_all()  # room for a caller waiting in put
