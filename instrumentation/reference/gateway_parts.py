"""Gateway components of the reference path: API-key auth, token bucket, replica router."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import threading
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from enum import StrEnum
from typing import Protocol

from tokenpath.config import ConfigError

DEFAULT_RATE_PER_SECOND = 1000.0
DEFAULT_BURST = 200.0
DEFAULT_AFFINITY_TOKENS = 64
DEFAULT_AFFINITY_MAX_IMBALANCE = 8


class ApiKeyAuth:
    """Bearer API keys, compared in constant time. An empty key set disables auth."""

    def __init__(self, api_keys: Sequence[str] = ()) -> None:
        self._digests = [hashlib.sha256(key.encode("utf-8")).digest() for key in api_keys]

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def check(self, authorization: str | None) -> bool:
        if not self._digests:
            return True
        if not authorization or not authorization.startswith("Bearer "):
            return False
        presented = hashlib.sha256(authorization[len("Bearer "):].strip().encode("utf-8")).digest()
        ok = False
        for digest in self._digests:  # no early exit: same work for every key
            ok |= hmac.compare_digest(presented, digest)
        return ok


class TokenBucket:
    """Token-bucket rate limiter: ``rate`` tokens per second, at most ``burst`` banked."""

    def __init__(self, rate: float = DEFAULT_RATE_PER_SECOND, burst: float = DEFAULT_BURST,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0:
            raise ConfigError("rate_limit_per_second", "must be greater than 0")
        if burst < 1:
            raise ConfigError("rate_limit_burst", "must be at least 1")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = burst
        self._last = clock()
        self._lock = threading.Lock()

    def try_acquire(self, cost: float = 1.0) -> bool:
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            if self._tokens >= cost:
                self._tokens -= cost
                return True
            return False

    def retry_after_seconds(self, cost: float = 1.0) -> float:
        with self._lock:
            return max(0.0, (cost - self._tokens) / self.rate)


class Replica(Protocol):
    """What the router needs from an engine replica."""

    @property
    def load(self) -> int: ...

    def generate(self, prompt_ids: list[int], max_tokens: int, request_id: str | None = None,
                 trace_headers: Mapping[str, str] | None = None) -> AsyncGenerator[int, None]: ...


class RoutingPolicy(StrEnum):
    ROUND_ROBIN = "round_robin"
    PREFIX_AFFINE = "prefix_affine"


class Router:
    """Picks a replica per request: round-robin, or prefix-affine (requests sharing their
    first ``affinity_tokens`` tokens go to the same replica, rendezvous hashing, unless it
    is more than ``max_imbalance`` requests busier than the least loaded one)."""

    def __init__(self, replicas: Sequence[Replica], names: Sequence[str],
                 policy: RoutingPolicy = RoutingPolicy.PREFIX_AFFINE,
                 affinity_tokens: int = DEFAULT_AFFINITY_TOKENS,
                 max_imbalance: int = DEFAULT_AFFINITY_MAX_IMBALANCE) -> None:
        if not replicas:
            raise ConfigError("replicas", "at least one engine replica is needed")
        if len(names) != len(replicas):
            raise ConfigError("replicas", "one name per replica")
        self.replicas = list(replicas)
        self.names = list(names)
        self.policy = RoutingPolicy(policy)
        self.affinity_tokens = affinity_tokens
        self.max_imbalance = max_imbalance
        self._round_robin = itertools.cycle(range(len(self.replicas)))

    def choose(self, prompt_ids: Sequence[int]) -> int:
        """Index of the replica for a prompt."""
        if self.policy is RoutingPolicy.ROUND_ROBIN or len(self.replicas) == 1:
            return next(self._round_robin)
        key = repr(tuple(prompt_ids[: self.affinity_tokens])).encode("ascii")
        best = max(
            range(len(self.replicas)),
            key=lambda i: hashlib.blake2b(key + self.names[i].encode(), digest_size=8).digest(),
        )
        loads = [replica.load for replica in self.replicas]
        if loads[best] - min(loads) > self.max_imbalance:
            return loads.index(min(loads))
        return best
