"""Prefix fingerprints: salted, chained block hashes of a prompt's token ids.

Fingerprint ``i`` identifies the whole token prefix up to the end of block ``i``
(``hash(salt, fingerprint[i-1], tokens of block i)``), so two requests share fingerprint
``i`` exactly when they share their first ``(i + 1) * block_tokens`` tokens. Only token
ids are hashed, never text, and the keyed hash (BLAKE2b with the salt as key) makes it
impractical to confirm a guessed prompt without the salt. Set a deployment-wide secret
salt with ``TOKENPATH_FINGERPRINT_SALT``; every component that compares fingerprints must
share it.
"""

from __future__ import annotations

import hashlib
import os
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

from tokenpath.config import ConfigError, check, validate_fields

FINGERPRINT_SALT_ENV = "TOKENPATH_FINGERPRINT_SALT"
DEFAULT_FINGERPRINT_SALT = b"tokenpath-default-salt"  # public: set your own secret salt
DEFAULT_FINGERPRINT_BLOCK_TOKENS = 64
DEFAULT_MAX_FINGERPRINTS = 64  # covers a 4,096-token prefix at the default block size
FINGERPRINT_DIGEST_BYTES = 8  # 16 hex characters


@dataclass(frozen=True, slots=True)
class FingerprintConfig:
    salt: bytes = DEFAULT_FINGERPRINT_SALT
    block_tokens: int = field(default=DEFAULT_FINGERPRINT_BLOCK_TOKENS, metadata=check(
        ge=1, key="fingerprint_block_tokens", message="must be at least 1"))
    max_fingerprints: int = field(default=DEFAULT_MAX_FINGERPRINTS,
                                  metadata=check(ge=0, message="must not be negative"))

    def validate(self) -> None:
        if not self.salt:
            raise ConfigError("fingerprint_salt", "must not be empty")
        if len(self.salt) > 64:
            raise ConfigError("fingerprint_salt", "at most 64 bytes (BLAKE2b key size)")
        validate_fields(self)

    @classmethod
    def from_env(cls) -> FingerprintConfig:
        """The default config with the salt from ``TOKENPATH_FINGERPRINT_SALT`` when set."""
        salt = os.environ.get(FINGERPRINT_SALT_ENV, "")
        config = cls(salt=salt.encode("utf-8")) if salt else cls()
        config.validate()
        return config


def prefix_fingerprints(token_ids: Sequence[int], config: FingerprintConfig) -> list[str]:
    """Hex fingerprints of every full block of ``token_ids``, first block first, capped at
    ``config.max_fingerprints``. A partial trailing block has no fingerprint."""
    block = config.block_tokens
    count = min(len(token_ids) // block, config.max_fingerprints)
    out: list[str] = []
    previous = b""
    for index in range(count):
        chunk = array("q", token_ids[index * block : (index + 1) * block]).tobytes()
        digest = hashlib.blake2b(
            previous + chunk, key=config.salt, digest_size=FINGERPRINT_DIGEST_BYTES
        ).digest()
        out.append(digest.hex())
        previous = digest
    return out
