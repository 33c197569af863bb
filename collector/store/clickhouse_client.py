"""The ClickHouse store's client (collector/store/clickhouse.py): the password, the
clickhouse-connect client for a server or for chDB, the lock every use of it takes, and
the owner file that keeps a chDB folder to one process at a time. The schema and queries
(collector/store/clickhouse_sql.py, collector/store/clickhouse_rollups.py) use it."""

from __future__ import annotations

import fcntl
import json
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from tokenpath.collector.store.url import ENV_PASSWORD, ENV_PASSWORD_FILE, Target
from tokenpath.config import ConfigError

OWNER_FILE = "tokenpath-owner.json"  # in a chDB folder: the process that has it open


def password() -> str:
    """$TOKENPATH_CLICKHOUSE_PASSWORD, else the first line of the file
    $TOKENPATH_CLICKHOUSE_PASSWORD_FILE names, else empty."""
    value = os.environ.get(ENV_PASSWORD)
    if value:
        return value
    path = os.environ.get(ENV_PASSWORD_FILE)
    if path:
        try:
            return Path(path).read_text().splitlines()[0] if Path(path).stat().st_size else ""
        except OSError as exc:
            raise ConfigError("store", f"${ENV_PASSWORD_FILE}: cannot read {path}: "
                              f"{exc.strerror}") from None
    return ""


# --- the client ------------------------------------------------------------------------------


class Owner:
    """A chDB folder is opened by one process at a time: the collector holds an exclusive
    lock on its owner file (and writes its pid and API URL there); a reader a shared one."""

    def __init__(self, folder: str, exclusive: bool) -> None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        self.path = Path(folder) / OWNER_FILE
        self._file: IO[str] | None = open(self.path, "a+")  # noqa: SIM115 - held open
        try:
            fcntl.flock(self._file, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
                        | fcntl.LOCK_NB)
        except OSError:
            self._file.seek(0)
            text = self._file.read()
            self._file.close()
            self._file = None
            raise ConfigError("store", self._held_message(folder, text)) from None
        if exclusive:
            self.announce(None)

    @staticmethod
    def _held_message(folder: str, text: str) -> str:
        try:
            owner = json.loads(text) if text.strip() else {}
        except ValueError:
            owner = {}
        pid = owner.get("pid")
        api = owner.get("api")
        who = f"a collector (pid {pid})" if pid else "another process"
        where = api or "http://HOST:PORT"
        return (f"chdb://{folder} is open in {who}: chDB opens a folder in one process at "
                f"a time; read it through that collector instead: --collector {where}")

    def announce(self, api_url: str | None) -> None:
        if self._file is None:
            return
        self._file.seek(0)
        self._file.truncate()
        self._file.write(json.dumps({"pid": os.getpid(), "api": api_url}))
        self._file.flush()

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


def connect(target: Target) -> Any:
    """A clickhouse-connect client (its chDB backend for ``chdb://``)."""
    try:
        import clickhouse_connect
    except ImportError:
        raise ConfigError("store", "the ClickHouse store needs clickhouse-connect (pip "
                          "install 'tokenpath[clickhouse]'; for chdb:// "
                          "'tokenpath[chdb]')") from None
    if target.chdb:
        return clickhouse_connect.get_client(dsn=f"chdb://{target.path}")
    secure = target.scheme == "clickhouses"
    client = clickhouse_connect.get_client(
        host=target.host, port=target.port or (8443 if secure else 8123),
        username=target.user, password=password(), secure=secure, database="default",
        # the writer and the readers share the client under a lock; no server session,
        # which would refuse a second query while one runs
        autogenerate_session_id=False)
    client.command(f"CREATE DATABASE IF NOT EXISTS `{target.database}`")
    client.database = target.database
    return client


class Connection:
    """The client and the lock every use of it takes (chDB runs queries in-process)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.lock = threading.Lock()

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        with self.lock:
            return [tuple(row) for row in self.client.query(sql).result_rows]

    def command(self, sql: str) -> None:
        with self.lock:
            self.client.command(sql)

    def insert(self, table: str, rows: list[list[Any]], columns: Sequence[str],
               token: str, settings: Mapping[str, Any] | None = None) -> None:
        if not rows:
            return
        with self.lock:
            self.client.insert(table, rows, column_names=list(columns),
                               settings={"insert_deduplication_token": token,
                                         **(settings or {})})

    def close(self) -> None:
        with self.lock:
            self.client.close()
