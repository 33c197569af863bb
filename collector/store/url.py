"""Where ``--store`` points: a ClickHouse URL (``clickhouse://``, ``clickhouses://``,
``chdb:///PATH``) or a SQLite path. Read by the store's config and by the factory
(collector/store/factory.py) alike, before either backend is imported; and where it is
when nothing names it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from tokenpath.config import ConfigError

SCHEMES = ("chdb", "clickhouse", "clickhouses")
ENV_PASSWORD = "TOKENPATH_CLICKHOUSE_PASSWORD"
ENV_PASSWORD_FILE = "TOKENPATH_CLICKHOUSE_PASSWORD_FILE"
DEFAULT_DATABASE = "tokenpath"
ENV_STORE = "TOKENPATH_STORE"


def default_store_path() -> str:
    """$TOKENPATH_STORE, else $XDG_DATA_HOME/tokenpath/store.db (~/.local/share/...)."""
    env = os.environ.get(ENV_STORE)
    if env:
        return env
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return str(Path(base) / "tokenpath" / "store.db")


def is_clickhouse_url(path: str) -> bool:
    return path.split("://", 1)[0].lower() in SCHEMES and "://" in path


@dataclass(frozen=True, slots=True)
class Target:
    """Where a ``--store`` URL points."""

    scheme: str
    path: str = ""  # chdb: the folder
    host: str = ""
    port: int | None = None
    user: str = "default"
    database: str = DEFAULT_DATABASE

    @property
    def chdb(self) -> bool:
        return self.scheme == "chdb"

    def describe(self) -> str:
        """The URL without a password (for logs)."""
        if self.chdb:
            return f"chdb://{self.path}"
        port = f":{self.port}" if self.port else ""
        return f"{self.scheme}://{self.user}@{self.host}{port}/{self.database}"


def parse_url(url: str) -> Target:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise ConfigError("store", f"not a ClickHouse URL: {url.split('://', 1)[0]}://...")
    if scheme == "chdb":
        path = unquote(parts.netloc + parts.path)
        if not path:
            raise ConfigError("store", "chdb:///PATH needs a folder")
        return Target("chdb", path=str(Path(path).expanduser()), database="default")
    if parts.password is not None:
        raise ConfigError("store", "a password in the store URL shows in ps and logs: set "
                          f"${ENV_PASSWORD} or ${ENV_PASSWORD_FILE} instead")
    try:
        port = parts.port
    except ValueError as exc:
        raise ConfigError("store", f"bad port in {scheme}:// URL: {exc}") from None
    database = parts.path.strip("/") or DEFAULT_DATABASE
    if not database.replace("_", "").isalnum():
        raise ConfigError("store", f"database name {database!r}: letters, digits and _ only")
    return Target(scheme, host=parts.hostname or "localhost", port=port,
                  user=unquote(parts.username) if parts.username else "default",
                  database=database)
