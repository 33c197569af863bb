"""A minimal OpenTelemetry-instrumented gateway in front of a vLLM server.

Stand-in for tokenpath's gateway shim (issue 2/9) until that is on main: a FastAPI app,
instrumented with plain ``opentelemetry-instrumentation-fastapi`` (no tokenpath code, so
the collector sees exactly what a user's own gateway would send), that forwards the
OpenAI routes to vLLM with ``httpx`` and a W3C ``traceparent`` header, so vLLM's
``llm_request`` span lands in the gateway's trace. Streams are passed through chunk by
chunk. Content is never logged or exported.

``python -m tokenpath.instrumentation.vllm.proxy --upstream URL --listen HOST:PORT
--otlp HOST:PORT`` runs it (OTLP/gRPC export to the collector); it answers with a W3C
``traceresponse`` header naming the gateway's trace id.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request, Response
from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tokenpath.config import parse_host_port
from tokenpath.endpoints import COLLECTOR_GRPC
from tokenpath.instrumentation.relay import relay_response
from tokenpath.instrumentation.request_ids import REQUEST_ID_HEADER, request_id_for

PROXY_SERVICE_NAME = "tokenpath-vllm-gateway"
FORWARDED_ROUTES = ("/v1/completions", "/v1/chat/completions")
HEALTH_ROUTE = "/health"
UNTRACED_URLS = "/health,/docs,/openapi.json"
UPSTREAM_TIMEOUT_SECONDS = 120.0
# Hop-by-hop and length headers are not copied from the upstream response.


def build_proxy_app(
    upstream_url: str,
    tracer_provider: TracerProvider,
    client: httpx.AsyncClient | None = None,
) -> FastAPI:
    """The gateway app; ``tracer_provider`` receives its server spans."""
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    http = client or httpx.AsyncClient(
        base_url=upstream_url.rstrip("/"), timeout=UPSTREAM_TIMEOUT_SECONDS
    )
    propagator = TraceContextTextMapPropagator()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await http.aclose()

    app = FastAPI(title="tokenpath vLLM gateway (test stand-in)", lifespan=lifespan)

    async def forward(request: Request) -> Response:
        body = await request.body()
        headers = {"content-type": request.headers.get("content-type", "application/json")}
        propagator.inject(headers)  # the FastAPI server span is current here
        # vLLM's request id names this trace, so the tokenpath plugin's annotation of the
        # request joins the trace (request_ids.py).
        request_id = request_id_for(trace.get_current_span().get_span_context())
        if request_id is not None:
            headers[REQUEST_ID_HEADER] = request_id
        upstream = http.build_request(request.method, request.url.path, content=body,
                                      headers=headers)
        response = await http.send(upstream, stream=True)
        return relay_response(response)

    for route in FORWARDED_ROUTES:
        app.add_api_route(route, forward, methods=["POST"])

    @app.get(HEALTH_ROUTE)
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    kwargs: dict[str, Any] = {"tracer_provider": tracer_provider}
    # Only the forwarded API routes are requests: a traced health probe or docs page would
    # be a gateway SERVER span, which the collector counts as a request.
    FastAPIInstrumentor.instrument_app(app, exclude_spans=["receive", "send"],
                                       excluded_urls=UNTRACED_URLS, **kwargs)
    return app


def main(argv: list[str] | None = None) -> int:
    import uvicorn
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.instrumentation.propagators import (
        TraceResponsePropagator,
        set_global_response_propagator,
    )
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--upstream", required=True, help="vLLM base URL")
    parser.add_argument("--listen", default="127.0.0.1:8080")
    parser.add_argument("--otlp", default=COLLECTOR_GRPC, help="collector OTLP/gRPC")
    args = parser.parse_args(argv)
    host, port = parse_host_port(args.listen, "--listen")
    # Tell clients the gateway's trace id (W3C ``traceresponse`` header).
    set_global_response_propagator(TraceResponsePropagator())  # type: ignore[no-untyped-call]
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: PROXY_SERVICE_NAME}))
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=args.otlp, insecure=True),
                           schedule_delay_millis=200)
    )
    try:
        uvicorn.run(build_proxy_app(args.upstream, provider), host=host, port=port,
                    log_level="warning")
    finally:
        provider.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
