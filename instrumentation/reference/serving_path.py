"""Assemble and run the reference serving path on loopback: engines, router, gateway app,
gateway shim, and a uvicorn server in a background thread."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI
from opentelemetry.trace import TracerProvider
from starlette.types import ASGIApp

from tokenpath.config import AT_LEAST_ONE, check, validate_fields
from tokenpath.instrumentation.gateway import GatewayConfig, GatewayInstrumentor
from tokenpath.instrumentation.reference.disaggregated import (
    DisaggregatedEngines,
    KvLinkConfig,
)
from tokenpath.instrumentation.reference.engine import (
    ROLE_DECODE,
    ROLE_PREFILL,
    EngineConfig,
    SimulatedEngine,
)
from tokenpath.instrumentation.reference.gateway_parts import (
    DEFAULT_BURST,
    DEFAULT_RATE_PER_SECOND,
    ApiKeyAuth,
    Replica,
    Router,
    RoutingPolicy,
    TokenBucket,
)
from tokenpath.instrumentation.reference.ground_truth import GroundTruthWriter
from tokenpath.instrumentation.reference.kv_cache import KVCacheStats
from tokenpath.instrumentation.reference.server import ServingComponents, create_app
from tokenpath.instrumentation.reference.tokenizer import ToyTokenizer

DEFAULT_HOST = "127.0.0.1"
DEFAULT_REPLICAS = 2
STARTUP_TIMEOUT_SECONDS = 15.0


@dataclass(frozen=True, slots=True)
class ReferencePathConfig:
    host: str = DEFAULT_HOST
    port: int = field(default=0,  # 0: pick a free port
                      metadata=check(ge=0, le=65535, message="out of range"))
    replicas: int = field(default=DEFAULT_REPLICAS, metadata=AT_LEAST_ONE)
    engine: EngineConfig = field(default_factory=EngineConfig)
    routing: RoutingPolicy = RoutingPolicy.PREFIX_AFFINE
    api_keys: tuple[str, ...] = ()
    rate_limit_per_second: float = DEFAULT_RATE_PER_SECOND
    rate_limit_burst: float = DEFAULT_BURST
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    instrument: bool = True
    # tokens per streamed SSE write
    stream_tokens_per_chunk: int = field(default=1, metadata=AT_LEAST_ONE)
    # disaggregated serving: ``replicas`` prefill engines (nodes "<node>-prefill-<i>") and
    # as many decode engines ("<node>-decode-<i>"), the KV cache sent over ``kv_link``
    disaggregated: bool = False
    kv_link: KvLinkConfig = field(default_factory=KvLinkConfig)

    def validate(self) -> None:
        validate_fields(self)
        self.engine.validate()
        self.gateway.validate()
        self.kv_link.validate()


class LoopbackServer:
    """Serves an ASGI app with uvicorn in a background thread; ``port`` 0 picks one."""

    def __init__(self, app: ASGIApp, host: str = DEFAULT_HOST, port: int = 0) -> None:
        self.app = app
        self.host = host
        self.port = port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        if self._server is not None:
            return
        server = uvicorn.Server(uvicorn.Config(
            self.app, host=self.host, port=self.port, log_level="warning",
            access_log=False, lifespan="on",
        ))
        thread = threading.Thread(target=lambda: asyncio.run(server.serve()),
                                  name="tokenpath-loopback-server", daemon=True)
        thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server failed to start on {self.host}:{self.port}")
            time.sleep(0.01)
        sockets = [s for srv in server.servers for s in srv.sockets]
        self.port = int(sockets[0].getsockname()[1])
        self._server, self._thread = server, thread

    def shutdown(self) -> None:
        """Stop serving (in-flight requests are aborted); idempotent."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None or thread is None:
            return
        server.should_exit = True
        thread.join(timeout=STARTUP_TIMEOUT_SECONDS)


class ReferenceServingPath:
    """The whole reference path. ``start()`` serves on ``base_url``; ``shutdown()`` stops."""

    def __init__(self, config: ReferencePathConfig | None = None,
                 tracer_provider: TracerProvider | None = None,
                 ground_truth: GroundTruthWriter | None = None) -> None:
        self.config = config or ReferencePathConfig()
        self.config.validate()
        self.disaggregated: DisaggregatedEngines | None = None
        if self.config.disaggregated:
            pools = {role: [SimulatedEngine(dataclasses.replace(
                self.config.engine, replica=f"{role}-{index}", role=role,
                node=f"{self.config.engine.node}-{role}-{index}"),
                tracer_provider=tracer_provider, ground_truth=ground_truth)
                for index in range(self.config.replicas)] for role in (ROLE_PREFILL, ROLE_DECODE)}
            self.engines = [*pools[ROLE_PREFILL], *pools[ROLE_DECODE]]
            self.disaggregated = DisaggregatedEngines(pools[ROLE_PREFILL], pools[ROLE_DECODE],
                                                      self.config.kv_link)
            replicas: list[Replica] = [self.disaggregated]
            names = ["prefill-decode"]
        else:
            self.engines = [
                SimulatedEngine(
                    dataclasses.replace(self.config.engine, replica=f"replica-{index}",
                                        node=f"{self.config.engine.node}-{index}"),
                    tracer_provider=tracer_provider, ground_truth=ground_truth,
                )
                for index in range(self.config.replicas)
            ]
            replicas, names = list(self.engines), [e.config.replica for e in self.engines]
        self.router = Router(replicas, names, policy=self.config.routing)
        self.app: FastAPI = create_app(ServingComponents(
            router=self.router, engines=self.engines, auth=ApiKeyAuth(self.config.api_keys),
            rate_limit=TokenBucket(self.config.rate_limit_per_second,
                                   self.config.rate_limit_burst),
            model=self.config.engine.model, tokenizer=ToyTokenizer(),
            stream_tokens_per_chunk=self.config.stream_tokens_per_chunk,
        ))
        if self.config.instrument:
            GatewayInstrumentor().instrument_app(self.app, tracer_provider=tracer_provider,
                                                 config=self.config.gateway)
        self._server = LoopbackServer(self.app, self.config.host, self.config.port)

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def base_url(self) -> str:
        return self._server.base_url

    def start(self) -> None:
        self._server.start()

    def shutdown(self) -> None:
        """Stop serving (in-flight requests are aborted); idempotent."""
        self._server.shutdown()

    def kv_stats(self) -> KVCacheStats:
        """Prefix-cache counters summed over the replicas (token-weighted)."""
        total = KVCacheStats()
        for engine in self.engines:
            total.query_tokens += engine.kv.stats.query_tokens
            total.hit_tokens += engine.kv.stats.hit_tokens
            total.evictions += engine.kv.stats.evictions
        return total
