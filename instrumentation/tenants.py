"""Who a request is for: the tenant the gateway shim puts on its span (``tokenpath.tenant``).

Derived from what the gateway knows, in this order:

1. the API key (``Authorization: Bearer ...``) looked up in a configured table of
   key -> tenant. The table is held as SHA-256 digests of the keys; an authenticated key
   always wins, so no header can bill another tenant;
2. a request header (``header``, e.g. ``x-tenant-id``), only when configured: off by
   default, because a client can send any value. Turn it on only behind a proxy that sets
   it and strips the client's;
3. else, with ``hash_salt`` set, ``key-`` and 12 hex digits of HMAC-SHA256(salt, key): a
   stable pseudonym per key that cannot be turned back into it;
4. else none (the record's tenant is unset; chargeback shows it as ``unattributed``).

The key itself never reaches a span, a record, a metric or a log. A tenant value is cut to
``MAX_TENANT_LENGTH`` characters.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tokenpath.config import ConfigError, check, validate_fields

TENANT_HEADER_EXAMPLE = "x-tenant-id"  # the usual name, when a trusted proxy sets it
MAX_TENANT_LENGTH = 64
HASHED_TENANT_PREFIX = "key-"
HASHED_TENANT_HEX_DIGITS = 12
AUTHORIZATION_HEADER = "authorization"
_BEARER = "bearer "


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


@dataclass(frozen=True, slots=True)
class TenantConfig:
    """``key_tenants``: API key -> tenant (kept as digests); ``header``: a request header
    naming the tenant, set by a trusted proxy (None, the default: not read); ``hash_salt``:
    pseudonymize other keys."""

    header: str | None = None  # opt-in: only behind a proxy that sets it
    key_tenants: Mapping[str, str] = field(default_factory=dict, repr=False)
    hash_salt: str | None = field(default=None, repr=False, metadata=check(
        min_length=16, optional=True, message="must be at least 16 characters"))

    def validate(self) -> None:
        if self.header is not None and (not self.header or self.header != self.header.strip()):
            raise ConfigError("tenants.header", "must be a header name")
        for tenant in self.key_tenants.values():
            if not tenant or len(tenant) > MAX_TENANT_LENGTH:
                raise ConfigError("tenants.keys",
                                  f"a tenant name must be 1 to {MAX_TENANT_LENGTH} characters")
        validate_fields(self, "tenants")


class TenantResolver:
    """Resolves a request's tenant from its headers (lower-cased names)."""

    def __init__(self, config: TenantConfig | None = None) -> None:
        self.config = config or TenantConfig()
        self.config.validate()
        self._header = self.config.header.lower() if self.config.header else None
        self._by_digest = {_digest(key): tenant
                           for key, tenant in self.config.key_tenants.items()}
        salt = self.config.hash_salt
        self._salt = salt.encode("utf-8") if salt is not None else None

    @property
    def header_names(self) -> frozenset[str]:
        """The request headers it reads."""
        names = {AUTHORIZATION_HEADER}
        if self._header:
            names.add(self._header)
        return frozenset(names)

    def resolve(self, headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> str | None:
        items = headers.items() if isinstance(headers, Mapping) else headers
        named: str | None = None
        key: str | None = None
        for name, value in items:
            if name == self._header and value.strip():
                named = value.strip()[:MAX_TENANT_LENGTH]
            elif name == AUTHORIZATION_HEADER and value[:len(_BEARER)].lower() == _BEARER:
                key = value[len(_BEARER):].strip() or None
        tenant = self._by_digest.get(_digest(key)) if key is not None else None
        if tenant is not None:
            return tenant
        if named is not None:
            return named
        if key is None:
            return None
        if self._salt is not None:
            mac = hmac.new(self._salt, key.encode("utf-8"), hashlib.sha256).hexdigest()
            return HASHED_TENANT_PREFIX + mac[:HASHED_TENANT_HEX_DIGITS]
        return None
