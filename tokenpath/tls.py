"""TLS and mutual TLS for the listeners (docs/reliability.md).

One certificate and key serve the collector's OTLP/HTTP (with the API and UI) and
OTLP/gRPC; the node agent's /metrics listener takes the same settings. With a client CA,
a listener requires a client certificate signed by it (mTLS) and refuses a client
without one during the handshake, before any request is read.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenpath.config import ConfigError, resolve

if TYPE_CHECKING:
    import grpc

ENV_TLS_CERT = "TOKENPATH_TLS_CERT"
ENV_TLS_KEY = "TOKENPATH_TLS_KEY"
ENV_TLS_CLIENT_CA = "TOKENPATH_TLS_CLIENT_CA"


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """PEM file paths. All empty: plaintext listeners (loopback default)."""

    cert: str | None = None
    key: str | None = None
    client_ca: str | None = None

    @classmethod
    def from_sources(cls, cert: str | None, key: str | None, client_ca: str | None,
                     file_keys: Mapping[str, Any]) -> TlsConfig:
        """Flag > ``TOKENPATH_TLS_*`` > the file's ``tls.cert``/``tls.key``/``tls.client_ca``
        (``file_keys`` holds them by those dotted names)."""
        return cls(
            cert=resolve("tls.cert", cert, ENV_TLS_CERT, file_keys, None, str),
            key=resolve("tls.key", key, ENV_TLS_KEY, file_keys, None, str),
            client_ca=resolve("tls.client_ca", client_ca, ENV_TLS_CLIENT_CA, file_keys,
                              None, str),
        )

    @property
    def enabled(self) -> bool:
        return self.cert is not None

    @property
    def mutual(self) -> bool:
        return self.client_ca is not None

    def validate(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ConfigError("tls.cert" if self.cert is None else "tls.key",
                              "--tls-cert and --tls-key must be given together")
        if self.client_ca is not None and self.cert is None:
            raise ConfigError("tls.client_ca", "needs --tls-cert and --tls-key")
        for key, path in (("tls.cert", self.cert), ("tls.key", self.key),
                          ("tls.client_ca", self.client_ca)):
            if path is not None and not Path(path).expanduser().is_file():
                raise ConfigError(key, f"no such file: {path}")
        if self.enabled:
            self.server_context()  # loads the files as the listeners will

    def server_context(self) -> ssl.SSLContext:
        """A server-side TLS context from the files, requiring a client certificate from
        ``client_ca`` when set (mTLS). A file that cannot be loaded is a ConfigError
        naming its key, at start, not a listener failing after start returned."""
        assert self.cert is not None and self.key is not None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            context.load_cert_chain(Path(self.cert).expanduser(), Path(self.key).expanduser())
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError("tls.cert", f"cannot load certificate {self.cert} with key "
                              f"{self.key}: {exc}") from exc
        if self.client_ca is not None:
            try:
                context.load_verify_locations(cafile=Path(self.client_ca).expanduser())
            except (ssl.SSLError, OSError) as exc:
                raise ConfigError("tls.client_ca", f"cannot load CA certificates from "
                                  f"{self.client_ca}: {exc}") from exc
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def _read(self, path: str) -> bytes:
        return Path(path).expanduser().read_bytes()

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """Server credentials for ``add_secure_port`` (requires client certs under mTLS)."""
        import grpc  # here: the node agent uses this class and has no gRPC listener

        assert self.cert is not None and self.key is not None
        return grpc.ssl_server_credentials(
            [(self._read(self.key), self._read(self.cert))],
            root_certificates=self._read(self.client_ca) if self.client_ca else None,
            require_client_auth=self.mutual,
        )

    def uvicorn_options(self) -> dict[str, Any]:
        """Keyword arguments for ``uvicorn.Config``."""
        if not self.enabled:
            return {}
        options: dict[str, Any] = {
            "ssl_certfile": str(Path(self.cert or "").expanduser()),
            "ssl_keyfile": str(Path(self.key or "").expanduser()),
        }
        if self.client_ca:
            options["ssl_ca_certs"] = str(Path(self.client_ca).expanduser())
            options["ssl_cert_reqs"] = ssl.CERT_REQUIRED
        return options


@dataclass(frozen=True, slots=True)
class ClientTlsConfig:
    """How a tokenpath client (the agent pushing to the collector) meets a TLS server:
    ``ca`` verifies it (else the system's CA store), ``cert`` and ``key`` are shown when
    the server requires client certificates (mTLS). ``setting`` names it in errors."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    setting: str = "collector_tls"

    @property
    def configured(self) -> bool:
        return self.ca is not None or self.cert is not None

    def validate(self) -> None:
        if (self.cert is None) != (self.key is None):
            missing = "cert" if self.cert is None else "key"
            raise ConfigError(f"{self.setting}.{missing}", "cert and key must be given together")
        for name, path in (("ca", self.ca), ("cert", self.cert), ("key", self.key)):
            if path is not None and not Path(path).expanduser().is_file():
                raise ConfigError(f"{self.setting}.{name}", f"no such file: {path}")
        if self.configured:
            self.client_context()

    def client_context(self) -> ssl.SSLContext:
        """A client-side context verifying the server (hostname included); a file that
        cannot be loaded is a ConfigError naming its key."""
        try:
            context = ssl.create_default_context(
                cafile=str(Path(self.ca).expanduser()) if self.ca is not None else None)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"{self.setting}.ca", f"cannot load CA certificates from "
                              f"{self.ca}: {exc}") from exc
        if self.cert is not None and self.key is not None:
            try:
                context.load_cert_chain(Path(self.cert).expanduser(),
                                        Path(self.key).expanduser())
            except (ssl.SSLError, OSError) as exc:
                raise ConfigError(f"{self.setting}.cert", f"cannot load certificate "
                                  f"{self.cert} with key {self.key}: {exc}") from exc
        return context
