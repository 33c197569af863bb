"""A ClickHouse server for tests: ClickHouse's HTTP interface, as far as the real
clickhouse-connect HTTP client uses it, over one chDB session (the ClickHouse engine
in-process) that runs every statement, one at a time under a lock.

What it speaks:

- ``GET``/``POST /`` with the statement in the ``query`` URL parameter, the body, or the
  parameter followed by the body; ``database`` (``USE`` for that statement), ``param_*``
  (``{name:Type}`` bind values), ``default_format``; every other parameter that is not a
  transport one (``session_id``, ``query_id``, ``wait_end_of_query``, ...) is a setting,
  ``SET`` before the statement and back to the server's default after it (chDB's, but
  for :data:`SERVER_DEFAULTS`);
- ``INSERT ... FORMAT fmt`` with the data after it in the body (or the statement in the
  URL and the whole body data), the body compressed or not (``Content-Encoding``: lz4
  frame, zstd, gzip, deflate), in one piece or chunked; the data goes to chDB's streaming
  insert (``Session.send_insert``), settings such as ``insert_deduplication_token`` apply;
- results in the statement's ``FORMAT`` (clickhouse-connect asks for ``Native``), else
  TabSeparated; compressed with lz4 when the client asks (``enable_http_compression=1``
  and ``Accept-Encoding: lz4``); ``X-ClickHouse-Summary``, ``-Query-Id``, ``-Format``,
  ``-Timezone`` headers;
- errors as the server sends them: ``Code: N. DB::Exception: ...`` in the body, the code
  in ``X-ClickHouse-Exception-Code``, HTTP 500 (401 for a wrong password);
- authentication by basic auth, ``X-ClickHouse-User``/``X-ClickHouse-Key`` or the
  ``user``/``password`` parameters, compared in constant time.

:meth:`ClickHouseHTTPServer.pause` closes the listening socket and every open connection
(connections are refused, answers in flight are lost), :meth:`~ClickHouseHTTPServer.resume`
listens on the same port again: an outage the client meets as it would a real one.
:attr:`~ClickHouseHTTPServer.lose_insert_answers` runs the next inserts and cuts their
connections before the answer (a lost answer: the client cannot tell whether it ran).
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import hmac
import json
import re
import socket
import threading
import time
import uuid
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import lz4.frame
import zstandard
from chdb import session as chdb_session

# URL parameters that are not settings (the HTTP interface's own, and the client's).
TRANSPORT = frozenset({
    "query", "database", "default_format", "user", "password", "quota_key", "session_id",
    "session_timeout", "session_check", "query_id", "compress", "decompress",
    "wait_end_of_query", "buffer_size", "client_protocol_version", "role",
})
# clickhouse-server's defaults where chDB's differ (the client reads them from
# system.settings: with compression on already, it would not ask for it).
SERVER_DEFAULTS = {"enable_http_compression": "0"}
# An INSERT whose data follows its FORMAT clause (one line, as clients write it).
_INSERT = re.compile(rb"\A\s*(INSERT\s+INTO\s[^\n]*?)\s+FORMAT\s+(\w+)[ \t]*(?:\r?\n|\Z)",
                     re.IGNORECASE)
_FORMAT = re.compile(r"\bFORMAT\s+(\w+)\s*;?\s*\Z", re.IGNORECASE)
_RESULTS = re.compile(r"\A\s*\(*\s*(SELECT|WITH|SHOW|DESC|DESCRIBE|EXISTS|EXPLAIN)\b",
                      re.IGNORECASE)
_CODE = re.compile(r"Code: (\d+)\.")
_NUMBER = re.compile(r"-?\d+(\.\d+)?")
UNKNOWN_ERROR_CODE = 1001  # STD_EXCEPTION
AUTHENTICATION_FAILED = 516


class ClickHouseError(Exception):
    def __init__(self, code: int, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


class LostAnswer(Exception):
    """The statement ran; its answer is not sent (the connection is cut)."""


def _literal(value: str) -> str:
    if _NUMBER.fullmatch(value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _frames(body: bytes, decompressor: Any) -> bytes:
    """Every frame of a body that holds several one after another (a streaming client
    compresses each block of an insert as a frame of its own), as the server reads it."""
    out = bytearray()
    rest = bytes(body)
    while rest:
        frame = decompressor()
        out += frame.decompress(rest)
        if not frame.eof:
            raise ClickHouseError(UNKNOWN_ERROR_CODE, "the compressed body ends inside a "
                                  "frame", 400)
        rest = frame.unused_data
    return bytes(out)


def _decompress(body: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding == "lz4":
        return _frames(body, lambda: lz4.frame.LZ4FrameDecompressor())
    if encoding == "zstd":
        return _frames(body, lambda: zstandard.ZstdDecompressor().decompressobj())
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "deflate":
        return zlib.decompress(body)
    raise ClickHouseError(UNKNOWN_ERROR_CODE, f"Unknown Content-Encoding {encoding}", 400)


def _count(result: object, name: str) -> int:
    """A count of chDB's result (a method of a query's, an attribute of an insert's)."""
    value = getattr(result, name, 0)
    return int(value() if callable(value) else value)


class ClickHouseHTTPServer:
    """``start()`` listens on 127.0.0.1 (port 0: a free one, kept across pause/resume)."""

    def __init__(self, path: Path | str, *, user: str = "default", password: str = "") -> None:
        self.path = str(path)
        self.user = user
        self.password = password
        self.port = 0
        self.statements: list[str] = []  # every statement run, for tests to look at
        self.lose_insert_answers = 0  # the next N inserts run, their answers lost (cut)
        session: Any = chdb_session.Session(self.path)  # type: ignore[no-untyped-call]
        for name, value in SERVER_DEFAULTS.items():
            session.query(f"SET {name} = {value}")
        self._session = session
        self._lock = threading.Lock()  # one statement at a time on the session
        self._state = threading.Lock()  # the server, its thread and the open connections
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()
        self._closed = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ClickHouseHTTPServer:
        with self._state:
            if self._closed:
                raise RuntimeError("the server was shut down")
            if self._server is None:
                self._listen()
        return self

    def resume(self) -> None:
        self.start()

    def pause(self) -> None:
        """Stop listening and cut every open connection: until :meth:`resume`, the client's
        connections are refused and an answer being written is lost."""
        with self._state:
            self._stop_listening()

    def shutdown(self) -> None:
        with self._state:
            if self._closed:
                return
            self._closed = True
            self._stop_listening()
        with self._lock:
            self._session.close()

    def query(self, sql: str, fmt: str = "TabSeparated") -> str:
        """Run a statement on the session directly (for tests' checks)."""
        with self._lock:
            return bytes(self._session.query(sql, fmt).bytes()).decode()

    def _listen(self) -> None:
        fake = self

        class Handler(_Handler):
            server_fake = fake

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self.port = int(server.server_address[1])
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="clickhouse-http",
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def _stop_listening(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=10)
        for connection in list(self._connections):
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        self._connections.clear()

    def _track(self, connection: socket.socket, open_: bool) -> bool:
        with self._state:
            if not open_:
                self._connections.discard(connection)
                return True
            if self._server is None:
                return False
            self._connections.add(connection)
            return True

    # --- statements ------------------------------------------------------------------------

    def authenticate(self, user: str, password: str) -> None:
        ok = hmac.compare_digest(user.encode(), self.user.encode())
        ok &= hmac.compare_digest(password.encode(), self.password.encode())
        if not ok:
            raise ClickHouseError(
                AUTHENTICATION_FAILED, f"Code: {AUTHENTICATION_FAILED}. DB::Exception: {user}: "
                "Authentication failed: password is incorrect, or there is no user with such "
                "name. (AUTHENTICATION_FAILED)", 401)

    def execute(self, params: dict[str, str], body: bytes
                ) -> tuple[bytes, dict[str, str], str | None]:
        """The result, its summary and its format (None for a statement without one)."""
        query = params.get("query", "")
        insert: re.Match[bytes] | None = None
        data = b""
        if query and body:  # the statement in the URL, the data in the body
            found = _INSERT.match(query.encode())
            if found is not None and found.end() == len(query.encode()):
                insert, data = found, body
        elif not query:  # both in the body
            insert = _INSERT.match(body)
            data = body[insert.end():] if insert is not None else b""
        if insert is None:
            query = f"{query}\n{body.decode()}" if query and body else query or body.decode()
        if not (query or insert):
            raise ClickHouseError(62, "Code: 62. DB::Exception: Empty query. (SYNTAX_ERROR)",
                                  400)
        settings = {k: v for k, v in params.items()
                    if k not in TRANSPORT and not k.startswith("param_")}
        binds = {k.removeprefix("param_"): v for k, v in params.items()
                 if k.startswith("param_")}
        with self._lock:
            self.statements.append(query if insert is None else insert.group(0).decode())
            session = self._session
            started = time.perf_counter_ns()
            applied: list[str] = []
            try:
                session.query(f"USE `{params.get('database') or 'default'}`")
                for name, value in settings.items():
                    session.query(f"SET {name} = {_literal(value)}")
                    applied.append(name)
                if insert is not None:
                    inserter = session.send_insert(insert.group(1).decode(),
                                                   insert.group(2).decode())
                    inserter.append(data)
                    result = inserter.finish()
                    if self.lose_insert_answers > 0:
                        self.lose_insert_answers -= 1
                        raise LostAnswer
                    fmt: str | None = None
                    output = b""
                else:
                    named = _FORMAT.search(query)
                    fmt = (named.group(1) if named else params.get("default_format")
                           or "TabSeparated") if _RESULTS.match(query) else None
                    result = session.query(query, params.get("default_format") or
                                           "TabSeparated", params=binds or None)
                    output = bytes(result.bytes())
            except (ClickHouseError, LostAnswer):
                raise
            except Exception as exc:
                message = str(exc).strip()
                code = _CODE.search(message)
                if code is None:
                    message = f"Code: {UNKNOWN_ERROR_CODE}. DB::Exception: {message}"
                raise ClickHouseError(int(code.group(1)) if code else UNKNOWN_ERROR_CODE,
                                      message) from None
            finally:
                for name in applied:
                    session.query(f"SET {name} = {SERVER_DEFAULTS.get(name, 'DEFAULT')}")
            elapsed = time.perf_counter_ns() - started
        summary = {name: str(_count(result, chdb_name)) for name, chdb_name in
                   (("read_rows", "rows_read"), ("read_bytes", "bytes_read"),
                    ("written_rows", "rows_written"), ("written_bytes", "bytes_written"))}
        summary.update(total_rows_to_read="0", result_rows="0",
                       result_bytes=str(len(output)), elapsed_ns=str(elapsed))
        return output, summary, fmt


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as clickhouse-connect's pool expects
    disable_nagle_algorithm = True  # headers and body are two writes
    server_fake: ClickHouseHTTPServer

    def log_message(self, format: str, *args: object) -> None:
        del format, args

    def setup(self) -> None:
        super().setup()
        if not self.server_fake._track(self.connection, True):  # accepted as it paused
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

    def finish(self) -> None:
        self.server_fake._track(self.connection, False)
        with contextlib.suppress(OSError):
            super().finish()

    def do_GET(self) -> None:
        self._answer(b"")

    def do_POST(self) -> None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = bytearray()
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            while self.rfile.readline().strip():  # trailers, up to the blank line
                pass
        else:
            body = bytearray(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        self._answer(bytes(body))

    def _answer(self, body: bytes) -> None:
        if self.path.split("?")[0] in ("/ping", "/ping/"):
            self._send(200, b"Ok.\n", {"Content-Type": "text/plain; charset=UTF-8"})
            return
        params = dict(parse_qsl(urlsplit(self.path).query, keep_blank_values=True))
        query_id = params.get("query_id") or str(uuid.uuid4())
        headers = {"X-ClickHouse-Query-Id": query_id, "X-ClickHouse-Timezone": "UTC"}
        fake = self.server_fake
        try:
            fake.authenticate(*self._credentials(params))
            body = _decompress(body, self.headers.get("Content-Encoding", ""))
            output, summary, fmt = fake.execute(params, body)
        except LostAnswer:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        except Exception as exc:
            if not isinstance(exc, ClickHouseError):
                exc = ClickHouseError(UNKNOWN_ERROR_CODE, f"Code: {UNKNOWN_ERROR_CODE}. "
                                      f"DB::Exception: {type(exc).__name__}: {exc}")
            headers["X-ClickHouse-Exception-Code"] = str(exc.code)
            headers["Content-Type"] = "text/plain; charset=UTF-8"
            self._send(exc.status, f"{exc}\n".encode(), headers)
            return
        headers["X-ClickHouse-Summary"] = json.dumps(summary, separators=(",", ":"))
        headers["Content-Type"] = ("application/octet-stream" if fmt and fmt != "TabSeparated"
                                   else "text/tab-separated-values; charset=UTF-8")
        if fmt is not None:
            headers["X-ClickHouse-Format"] = fmt
        accepted = [e.strip() for e in self.headers.get("Accept-Encoding", "").split(",")]
        if output and params.get("enable_http_compression") == "1" and "lz4" in accepted:
            output = lz4.frame.compress(output)
            headers["Content-Encoding"] = "lz4"
        self._send(200, output, headers)

    def _credentials(self, params: dict[str, str]) -> tuple[str, str]:
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
            return user, password
        if "X-ClickHouse-User" in self.headers:
            return (self.headers["X-ClickHouse-User"],
                    self.headers.get("X-ClickHouse-Key", ""))
        return params.get("user", "default"), params.get("password", "")

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        try:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the connection was cut (pause) or the client went away
            self.close_connection = True
