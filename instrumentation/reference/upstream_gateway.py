"""The reference gateway in front of real OpenAI-compatible engines (e.g. vLLM).

Same auth, token bucket and gateway-shim helpers as the reference server, but the engine
is remote: the request body is forwarded unchanged to one of ``upstream_urls`` (round
robin) with the gateway's ``traceparent``, and the response is streamed back chunk by
chunk. Used by ``tokenpath demo --engine vllm``; also a template for instrumenting a real
gateway. Content is never logged or exported.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from tokenpath import attributes as attr
from tokenpath.config import check, validate_fields
from tokenpath.instrumentation.gateway import (
    annotate,
    gateway_stage,
    mark_engine_handoff,
    trace_headers,
)
from tokenpath.instrumentation.reference.gateway_parts import ApiKeyAuth, TokenBucket
from tokenpath.instrumentation.relay import relay_response
from tokenpath.stages import StageId

FORWARDED_ROUTES = ("/v1/chat/completions", "/v1/completions")
UPSTREAM_TIMEOUT_SECONDS = 300.0
# Hop-by-hop and length headers are not copied from the upstream response.


@dataclass(frozen=True, slots=True)
class UpstreamGatewayParts:
    upstream_urls: Sequence[str] = field(metadata=check(
        non_empty=True, key="upstreams", message="at least one upstream engine URL is needed"))
    auth: ApiKeyAuth
    rate_limit: TokenBucket
    model: str

    def validate(self) -> None:
        validate_fields(self)


def create_upstream_gateway(parts: UpstreamGatewayParts) -> FastAPI:
    parts.validate()
    clients = [httpx.AsyncClient(base_url=url.rstrip("/"), timeout=UPSTREAM_TIMEOUT_SECONDS)
               for url in parts.upstream_urls]
    turn = itertools.cycle(range(len(clients)))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        for client in clients:
            await client.aclose()

    app = FastAPI(title="tokenpath reference gateway (upstream engines)", lifespan=lifespan)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    async def forward(request: Request) -> Response:
        with gateway_stage(StageId.AUTH_RATELIMIT):
            if not parts.auth.check(request.headers.get("authorization")):
                return JSONResponse({"error": {"message": "invalid API key"}}, status_code=401)
            if not parts.rate_limit.try_acquire():
                retry = max(1, round(parts.rate_limit.retry_after_seconds() + 0.5))
                return JSONResponse({"error": {"message": "rate limit exceeded"}},
                                    status_code=429, headers={"Retry-After": str(retry)})
        body = await request.body()
        annotate(attr.GEN_AI_REQUEST_MODEL, parts.model)
        with gateway_stage(StageId.ROUTER):
            client = clients[next(turn)]
        headers = {"content-type": request.headers.get("content-type", "application/json")}
        headers.update(trace_headers())
        mark_engine_handoff()
        upstream = client.build_request(request.method, request.url.path, content=body,
                                        headers=headers)
        try:
            response = await client.send(upstream, stream=True)
        except httpx.HTTPError as exc:
            return JSONResponse({"error": {"message": f"upstream unavailable: {exc}"}},
                                status_code=502)
        return relay_response(response)

    for route in FORWARDED_ROUTES:
        app.add_api_route(route, forward, methods=["POST"])
    return app
