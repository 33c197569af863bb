"""Bearer-token check shared by every listener: constant time, token never logged."""

from __future__ import annotations

import hmac

BEARER_PREFIX = "bearer "


def bearer_matches(header_value: str | None, token: str) -> bool:
    """True when ``Authorization`` carries ``Bearer <token>`` (compared in constant time)."""
    if not header_value or header_value[: len(BEARER_PREFIX)].lower() != BEARER_PREFIX:
        return False
    presented = header_value[len(BEARER_PREFIX):].strip().encode("utf-8")
    return hmac.compare_digest(presented, token.encode("utf-8"))
