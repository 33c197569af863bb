"""The agent's KV-event receiver: ZeroMQ SUB endpoints the node's engines publish to.

``--kv-events [ENGINE_ID=]tcp://HOST:PORT`` (repeatable) names one endpoint. The agent
binds a SUB socket there and the engines connect their PUB sockets to it (vLLM connects
to any ``tcp://`` address without ``*`` or ``::``); when the address is not this host's
(``EADDRNOTAVAIL``) or an engine already bound it (``EADDRINUSE``), the agent connects to
it instead. Engines sharing an endpoint are told apart by their topic, which should be
set to the engine's id; ``ENGINE_ID=`` names the one engine of an endpoint whatever its
topic. An empty topic on an endpoint without ``ENGINE_ID`` is the engine ``HOST:PORT``.

Each engine's batches carry a sequence number counting up from 0. A jump forward is a
gap: the missing batches are fetched from the engine's replay endpoint when one is
configured (``kv_events_replay``), else counted as dropped (``reason="gap"``). A number
at or below the last one is a restarted engine: its index is emptied. Messages that are
not three frames, or whose sequence frame is not 8 bytes, are ``malformed``; payloads
that do not decode are ``undecodable``. None of them stops the receiver.

One thread receives, decodes and applies; it takes at most ``MAX_MESSAGES_PER_TURN``
messages from a socket before polling the others, and each message is bounded by
``MAX_MESSAGE_BYTES``, so no step holds the interpreter for long.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

import zmq

from tokenpath.agent.kv_index import (
    DROP_GAP,
    DROP_MALFORMED,
    DROP_UNDECODABLE,
    KvTracker,
)
from tokenpath.agent.kv_wire import KvDecodeError, decode_batch, decode_sequence
from tokenpath.config import ConfigError

logger = logging.getLogger(__name__)

MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024
MAX_MESSAGES_PER_TURN: Final = 64
POLL_TIMEOUT_MS: Final = 100
RECEIVE_HWM: Final = 100_000
REPLAY_TIMEOUT_SECONDS: Final = 2.0
MAX_ENGINE_ID_CHARS: Final = 253
FRAMES: Final = 3
REPLAY_END: Final = -1
_BIND_FALLBACK_ERRNOS: Final = frozenset({errno.EADDRNOTAVAIL, errno.EADDRINUSE})


@dataclass(frozen=True, slots=True)
class KvEndpoint:
    """One ``--kv-events`` value: the ZeroMQ address and the engine id, when named."""

    address: str
    engine_id: str | None = None

    @property
    def label(self) -> str:
        """``HOST:PORT``: the engine of an empty topic when no id is named."""
        return self.address.removeprefix("tcp://")


def parse_kv_endpoint(value: str, key: str = "kv_events") -> KvEndpoint:
    """``[ENGINE_ID=]tcp://HOST:PORT``; errors name ``key``."""
    engine_id: str | None = None
    address = value.strip()
    head, sep, tail = address.partition("=")
    if sep and "://" not in head:
        engine_id, address = head.strip(), tail.strip()
        check_engine_id(engine_id, key)
    parts = urlsplit(address)
    try:
        port = parts.port
    except ValueError as exc:
        raise ConfigError(key, f"bad port in {value!r}") from exc
    if parts.scheme != "tcp" or not parts.hostname or port is None or parts.path:
        raise ConfigError(key, f"expected [ENGINE_ID=]tcp://HOST:PORT, got {value!r}")
    return KvEndpoint(address, engine_id)


def check_engine_id(engine_id: str, key: str) -> None:
    if not engine_id or len(engine_id) > MAX_ENGINE_ID_CHARS or not engine_id.isprintable():
        raise ConfigError(key, f"engine id must be 1 to {MAX_ENGINE_ID_CHARS} printable "
                          f"characters, got {engine_id!r}")


@dataclass(slots=True)
class _Stream:
    """One engine's position in its publisher's sequence."""

    last: int | None = None


class KvEventReceiver:
    """Receives every endpoint's batches on one thread and applies them to ``tracker``."""

    def __init__(self, endpoints: Sequence[KvEndpoint], tracker: KvTracker, *,
                 replay: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 replay_timeout_seconds: float = REPLAY_TIMEOUT_SECONDS) -> None:
        self._endpoints = tuple(endpoints)
        self.tracker = tracker
        self._replay = dict(replay or {})
        self._clock = clock
        self._replay_timeout = replay_timeout_seconds
        self._context: zmq.Context[zmq.Socket[bytes]] | None = None
        self._sockets: dict[zmq.Socket[bytes], KvEndpoint] = {}
        self._streams: dict[str, _Stream] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.bound: dict[str, bool] = {}  # address -> bound (True) or connected (False)

    def start(self) -> None:
        """Open every endpoint (errors raise here, naming the endpoint), then receive."""
        if self._thread is not None:
            return
        self._context = zmq.Context()
        try:
            for endpoint in self._endpoints:
                self._sockets[self._open(endpoint)] = endpoint
        except zmq.ZMQError as exc:
            self._close()
            raise ConfigError("kv_events", f"{exc}") from exc
        self._thread = threading.Thread(target=self._run, name="tokenpath-agent-kv-events",
                                        daemon=True)
        self._thread.start()

    def _open(self, endpoint: KvEndpoint) -> zmq.Socket[bytes]:
        assert self._context is not None
        sock = self._context.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        sock.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        try:
            sock.bind(endpoint.address)
            self.bound[endpoint.address] = True
        except zmq.ZMQError as exc:
            if exc.errno not in _BIND_FALLBACK_ERRNOS:
                sock.close()
                raise zmq.ZMQError(exc.errno, f"{endpoint.address}: {exc.strerror}") from exc
            sock.connect(endpoint.address)  # the engine binds it, or it is another host's
            self.bound[endpoint.address] = False
        return sock

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._close()

    def _close(self) -> None:
        for sock in self._sockets:
            sock.close(linger=0)
        self._sockets.clear()
        if self._context is not None:
            self._context.term()
            self._context = None

    # -- receiving ------------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        for sock in self._sockets:
            poller.register(sock, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                ready = poller.poll(POLL_TIMEOUT_MS)
            except zmq.ZMQError:
                logger.exception("kv events: poll failed")
                self._stop.wait(POLL_TIMEOUT_MS / 1000)
                continue
            for sock, _ in ready:
                endpoint = self._sockets[sock]
                for _ in range(MAX_MESSAGES_PER_TURN):
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    except zmq.ZMQError:
                        logger.exception("kv events: receive failed on %s", endpoint.address)
                        break
                    self.handle(endpoint, frames)

    def handle(self, endpoint: KvEndpoint, frames: Sequence[bytes]) -> None:
        """Apply one multipart message ``(topic, sequence, payload)``; never raises."""
        engine = endpoint.engine_id or endpoint.label
        try:
            if len(frames) != FRAMES:
                raise KvDecodeError(f"{len(frames)} frames")
            topic, sequence, payload = frames
            if endpoint.engine_id is None and topic:
                engine = topic.decode("utf-8")
                if len(engine) > MAX_ENGINE_ID_CHARS or not engine.isprintable():
                    engine = endpoint.label
                    raise KvDecodeError("topic is not an engine id")
            seq = decode_sequence(sequence)
        except (KvDecodeError, UnicodeDecodeError):
            self.tracker.drop(engine, DROP_MALFORMED)
            return
        try:
            self._receive(engine, seq, payload)
        except Exception:  # telemetry never stops on one bad batch
            logger.debug("kv events: batch from %s failed", engine, exc_info=True)
            self.tracker.drop(engine, DROP_UNDECODABLE)

    def _receive(self, engine: str, seq: int, payload: bytes) -> None:
        stream = self._streams.get(engine)
        if stream is None:
            self._streams[engine] = stream = _Stream()
        last = stream.last
        if seq < 0:
            self.tracker.drop(engine, DROP_MALFORMED)
            return
        if last is not None and seq <= last:  # the publisher started again
            self.tracker.reset(engine)
        elif last is None and seq > 0 and engine in self._replay:
            self._catch_up(engine, 0, seq)  # joined late: what the engine still keeps
        elif last is not None and seq > last + 1:
            missing = seq - last - 1
            if engine in self._replay:
                missing -= self._catch_up(engine, last + 1, seq)
            if missing > 0:
                self.tracker.drop(engine, DROP_GAP, float(missing))
        stream.last = seq
        self._apply(engine, payload)

    def _apply(self, engine: str, payload: bytes) -> None:
        try:
            batch = decode_batch(payload)
        except KvDecodeError:
            self.tracker.drop(engine, DROP_UNDECODABLE)
            return
        self.tracker.apply(engine, batch)

    def _catch_up(self, engine: str, start: int, end: int) -> int:
        """Batches ``start`` to ``end - 1`` from the engine's replay endpoint, applied in
        order; returns how many arrived (before the end marker or the timeout)."""
        assert self._context is not None
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        applied = 0
        try:
            sock.connect(self._replay[engine])
            sock.send_multipart((b"", start.to_bytes(8, "big")))
            deadline = self._clock() + self._replay_timeout
            expected = start
            while expected < end:
                left_ms = int((deadline - self._clock()) * 1000)
                if left_ms <= 0 or not sock.poll(left_ms):
                    break
                frames = sock.recv_multipart()
                if len(frames) != FRAMES or frames[0]:
                    self.tracker.drop(engine, DROP_MALFORMED)
                    continue
                seq = decode_sequence(frames[1])
                if seq == REPLAY_END:
                    break
                if seq != expected:
                    continue  # older than asked, or past a batch the buffer lost
                self._apply(engine, frames[2])
                applied += 1
                expected += 1
        except (zmq.ZMQError, KvDecodeError):
            logger.debug("kv events: replay from %s failed", engine, exc_info=True)
        finally:
            sock.close(linger=0)
        return applied
