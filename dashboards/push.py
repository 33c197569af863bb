"""Push the generated dashboards to a Grafana server through grafana-client.

Uses the documented HTTP API: ``GET /api/health``, ``GET /api/folders/{uid}`` and
``POST /api/folders`` (the target folder), ``POST /api/dashboards/db`` (one per dashboard,
``overwrite: true`` so pushing twice is idempotent).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grafana_client.api import GrafanaApi
from grafana_client.client import GrafanaClientError, GrafanaException

from tokenpath.config import ConfigError, check, validate_fields

DEFAULT_GRAFANA_URL = "http://127.0.0.1:3000"
DEFAULT_FOLDER_UID = "tokenpath"
DEFAULT_FOLDER_TITLE = "tokenpath"
DEFAULT_TIMEOUT_SECONDS = 10.0
HTTP_NOT_FOUND = 404
HEALTH_PATH = "/health"
HEALTH_OK = "ok"


class PushError(RuntimeError):
    """Grafana refused or could not be reached."""


@dataclass(frozen=True, slots=True)
class PushConfig:
    url: str = DEFAULT_GRAFANA_URL
    token: str | None = None
    folder_uid: str = field(default=DEFAULT_FOLDER_UID, metadata=check(non_empty=True))
    folder_title: str = DEFAULT_FOLDER_TITLE
    timeout_seconds: float = field(default=DEFAULT_TIMEOUT_SECONDS,
                                   metadata=check(gt=0, message="must be positive"))

    def validate(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError("url", f"must be an http(s) URL, got {self.url!r}")
        validate_fields(self)


@dataclass(frozen=True, slots=True)
class PushedDashboard:
    uid: str
    url: str
    version: int


class DashboardPusher:
    """Creates the folder when missing and posts each dashboard into it."""

    def __init__(self, config: PushConfig) -> None:
        config.validate()
        self._config = config
        self._api = GrafanaApi.from_url(config.url, credential=config.token,
                                        timeout=config.timeout_seconds)

    def check_health(self) -> None:
        try:
            health: dict[str, Any] = self._api.client.GET(HEALTH_PATH)
        except GrafanaException as exc:
            raise PushError(f"Grafana health check failed: {exc.message}") from exc
        except OSError as exc:
            raise PushError(f"cannot reach Grafana at {self._config.url}: {exc}") from exc
        if health.get("database") != HEALTH_OK:
            raise PushError(f"Grafana is not healthy: {health}")

    def ensure_folder(self) -> None:
        try:
            self._api.folder.get_folder(self._config.folder_uid)
            return
        except GrafanaClientError as exc:
            if exc.status_code != HTTP_NOT_FOUND:
                raise PushError(f"folder lookup failed: {exc.message}") from exc
        try:
            self._api.folder.create_folder(self._config.folder_title,
                                           uid=self._config.folder_uid)
        except GrafanaException as exc:
            raise PushError(f"folder creation failed: {exc.message}") from exc

    def push(self, dashboard: dict[str, Any]) -> PushedDashboard:
        payload = {"dashboard": {**dashboard, "id": None},
                   "folderUid": self._config.folder_uid, "overwrite": True,
                   "message": "tokenpath dashboards push"}
        try:
            reply: dict[str, Any] = self._api.dashboard.update_dashboard(payload)
        except GrafanaException as exc:
            raise PushError(f"dashboard {dashboard.get('uid')}: {exc.message}") from exc
        return PushedDashboard(str(reply.get("uid")), str(reply.get("url")),
                               int(reply.get("version", 0)))

    def push_files(self, paths: Sequence[Path]) -> list[PushedDashboard]:
        self.check_health()
        self.ensure_folder()
        return [self.push(json.loads(path.read_text(encoding="utf-8"))) for path in paths]
