"""A local HTTP double of the few documented Grafana HTTP API endpoints `tokenpath
dashboards push` uses: GET /api/health, GET /api/folders/{uid}, POST /api/folders,
POST /api/dashboards/db. It follows the documented request and response shapes
(https://grafana.com/docs/grafana/latest/developers/http_api/) and is the one fake in the
dashboards tests: no Grafana server installs here."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

from testkit.support.loopback_http import LoopbackHTTPServer


class GrafanaDouble:
    def __init__(self, token: str | None = None) -> None:
        self.token = token
        self.folders: dict[str, dict[str, Any]] = {}
        self.dashboards: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._server = LoopbackHTTPServer(self._handler(), start=False)

    @property
    def url(self) -> str:
        return self._server.base_url

    def start(self) -> None:
        self._server.start()

    def shutdown(self) -> None:
        self._server.shutdown()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def _reply(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                if double.token is None:
                    return True
                return self.headers.get("Authorization") == f"Bearer {double.token}"

            def do_GET(self) -> None:
                with double._lock:
                    double.requests.append(("GET", self.path))
                if self.path == "/api/health":
                    self._reply(200, {"commit": "double", "database": "ok",
                                      "version": "11.0.0"})
                elif not self._authorized():
                    self._reply(401, {"message": "Unauthorized"})
                elif self.path.startswith("/api/folders/"):
                    uid = self.path.rsplit("/", 1)[1]
                    folder = double.folders.get(uid)
                    if folder is None:
                        self._reply(404, {"message": "folder not found", "status": "not-found"})
                    else:
                        self._reply(200, folder)
                else:
                    self._reply(404, {"message": "Not found"})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                with double._lock:
                    double.requests.append(("POST", self.path))
                if not self._authorized():
                    self._reply(401, {"message": "Unauthorized"})
                elif self.path == "/api/folders":
                    uid, title = body.get("uid"), body.get("title")
                    if not title:
                        self._reply(400, {"message": "folder title cannot be empty"})
                        return
                    if uid in double.folders:
                        self._reply(409, {"message": "a folder with the same uid already exists"})
                        return
                    folder = {"id": len(double.folders) + 1, "uid": uid, "title": title,
                              "url": f"/dashboards/f/{uid}/", "version": 1}
                    double.folders[uid] = folder
                    self._reply(200, folder)
                elif self.path == "/api/dashboards/db":
                    self._post_dashboard(body)
                else:
                    self._reply(404, {"message": "Not found"})

            def _post_dashboard(self, body: dict[str, Any]) -> None:
                dashboard = body.get("dashboard") or {}
                uid, title = dashboard.get("uid"), dashboard.get("title")
                if not uid or not title:
                    self._reply(400, {"message": "Dashboard title cannot be empty"})
                    return
                folder_uid = body.get("folderUid")
                if folder_uid and folder_uid not in double.folders:
                    self._reply(400, {"message": "folder not found"})
                    return
                existing = double.dashboards.get(uid)
                if existing is not None and not body.get("overwrite"):
                    self._reply(412, {"message": "The dashboard has been changed by someone "
                                      "else", "status": "version-mismatch"})
                    return
                version = 1 if existing is None else existing["version"] + 1
                double.dashboards[uid] = {"dashboard": dashboard, "folderUid": folder_uid,
                                          "version": version}
                self._reply(200, {"id": len(double.dashboards), "uid": uid,
                                  "url": f"/d/{uid}/{title.lower().replace(' ', '-')}",
                                  "status": "success", "version": version, "slug": uid})

        return Handler
