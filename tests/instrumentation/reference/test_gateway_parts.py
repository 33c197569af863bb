from __future__ import annotations

import pytest

from tokenpath.config import ConfigError
from tokenpath.instrumentation.reference.gateway_parts import (
    ApiKeyAuth,
    Router,
    RoutingPolicy,
    TokenBucket,
)


class _Replica:
    def __init__(self, load: int = 0) -> None:
        self.load = load

    def generate(self, *args: object, **kwargs: object) -> object:  # pragma: no cover
        raise NotImplementedError


def test_api_keys() -> None:
    auth = ApiKeyAuth(["k1", "k2"])
    assert auth.check("Bearer k2")
    assert not auth.check("Bearer k3")
    assert not auth.check("k1")
    assert not auth.check(None)
    assert ApiKeyAuth().check(None)  # no keys configured: open


def test_token_bucket_refills_at_its_rate() -> None:
    now = [0.0]
    bucket = TokenBucket(rate=2.0, burst=2.0, clock=lambda: now[0])
    assert bucket.try_acquire() and bucket.try_acquire()
    assert not bucket.try_acquire()
    assert bucket.retry_after_seconds() == pytest.approx(0.5)
    now[0] = 0.5
    assert bucket.try_acquire()
    assert not bucket.try_acquire()
    now[0] = 100.0
    assert bucket.try_acquire() and bucket.try_acquire()  # never banks more than burst
    assert not bucket.try_acquire()


def test_round_robin_cycles() -> None:
    router = Router([_Replica(), _Replica(), _Replica()], ["a", "b", "c"],  # type: ignore[list-item]
                    policy=RoutingPolicy.ROUND_ROBIN)
    assert [router.choose([1]) for _ in range(6)] == [0, 1, 2, 0, 1, 2]


def test_prefix_affine_keeps_a_shared_prefix_on_one_replica_unless_overloaded() -> None:
    replicas = [_Replica(), _Replica(), _Replica(), _Replica()]
    router = Router(replicas, ["a", "b", "c", "d"], affinity_tokens=4,  # type: ignore[arg-type]
                    max_imbalance=2)
    first = router.choose([1, 2, 3, 4, 99])
    assert all(router.choose([1, 2, 3, 4, tail]) == first for tail in range(20))
    spread = {router.choose([p, p, p, p]) for p in range(40)}
    assert len(spread) > 1  # different prefixes spread over replicas
    replicas[first].load = 10
    assert router.choose([1, 2, 3, 4]) != first


def test_router_validation() -> None:
    with pytest.raises(ConfigError):
        Router([], [])
    with pytest.raises(ConfigError):
        TokenBucket(rate=0)
