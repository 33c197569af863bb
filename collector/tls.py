"""TLS and mutual TLS for both listeners (SPEC section 8).

One certificate and key serve OTLP/HTTP (with the API and UI) and OTLP/gRPC. With a
client CA, both listeners require a client certificate signed by it (mTLS) and refuse a
client without one during the handshake, before any request is read.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from tokenpath.config import ConfigError

ENV_TLS_CERT = "TOKENPATH_TLS_CERT"
ENV_TLS_KEY = "TOKENPATH_TLS_KEY"
ENV_TLS_CLIENT_CA = "TOKENPATH_TLS_CLIENT_CA"


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """PEM file paths. All empty: plaintext listeners (loopback default)."""

    cert: str | None = None
    key: str | None = None
    client_ca: str | None = None

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
        if self.cert is not None and self.key is not None:
            self._check_loadable(self.cert, self.key, self.client_ca)

    @staticmethod
    def _check_loadable(cert: str, key: str, client_ca: str | None) -> None:
        """Loads the files as the listeners will, so a bad one is an error at start that
        names its key, not a listener thread dying after start returned."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            context.load_cert_chain(Path(cert).expanduser(), Path(key).expanduser())
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError("tls.cert", f"cannot load certificate {cert} with key {key}: "
                              f"{exc}") from exc
        if client_ca is not None:
            try:
                context.load_verify_locations(cafile=Path(client_ca).expanduser())
            except (ssl.SSLError, OSError) as exc:
                raise ConfigError("tls.client_ca",
                                  f"cannot load CA certificates from {client_ca}: {exc}") from exc

    def _read(self, path: str) -> bytes:
        return Path(path).expanduser().read_bytes()

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """Server credentials for ``add_secure_port`` (requires client certs under mTLS)."""
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
