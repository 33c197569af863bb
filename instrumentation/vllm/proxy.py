"""A minimal OpenTelemetry-instrumented gateway in front of a vLLM server.

A FastAPI app, instrumented with plain ``opentelemetry-instrumentation-fastapi``, that
forwards the OpenAI routes to vLLM with ``httpx`` and a W3C ``traceparent`` header, so
vLLM's ``llm_request`` span lands in the gateway's trace. Streams are passed through chunk
by chunk. Content is never logged or exported.

On its server span it adds, as the gateway shim does (never content): the request's
top-level ``model`` (``gen_ai.request.model``) and the numbers of the response's ``usage``
and vLLM's per-request ``metrics`` (:mod:`tokenpath.instrumentation.llm_payload`), and it
sends vLLM an ``X-Request-Id`` naming its trace. ``plain=True`` (``--plain``) leaves all of
that out: the collector then sees exactly what a user's own stock-instrumented gateway
would send.

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

from tokenpath import attributes as attr
from tokenpath.config import parse_host_port
from tokenpath.endpoints import COLLECTOR_GRPC
from tokenpath.instrumentation.llm_payload import (
    ResponseTail,
    request_model,
    response_attributes,
)
from tokenpath.instrumentation.relay import relay_response
from tokenpath.instrumentation.request_ids import REQUEST_ID_HEADER, request_id_for
from tokenpath.instrumentation.safety import telemetry_errors

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
    plain: bool = False,
) -> FastAPI:
    """The gateway app; ``tracer_provider`` receives its server spans. ``plain``: stock
    instrumentation only (no model, usage or request id of tokenpath's)."""
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
        if plain:
            upstream = http.build_request(request.method, request.url.path, content=body,
                                          headers=headers)
            return relay_response(await http.send(upstream, stream=True))
        span = trace.get_current_span()
        # vLLM's request id names this trace, so the tokenpath plugin's annotation of the
        # request joins the trace (request_ids.py).
        request_id = request_id_for(span.get_span_context())
        if request_id is not None:
            headers[REQUEST_ID_HEADER] = request_id
        model = request_model(body)
        if model is not None:
            span.set_attribute(attr.GEN_AI_REQUEST_MODEL, model)
        upstream = http.build_request(request.method, request.url.path, content=body,
                                      headers=headers)
        response = await http.send(upstream, stream=True)
        if not 200 <= response.status_code < 300:
            return relay_response(response)

        def usage_onto_span(tail: ResponseTail) -> None:
            try:
                span.set_attributes(response_attributes(tail.tail()))
            except Exception as exc:
                telemetry_errors.count("proxy.response_usage", exc)

        return relay_response(response, usage_onto_span)

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
    parser.add_argument("--plain", action="store_true",
                        help="stock instrumentation only: no model, usage or request id")
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
        uvicorn.run(build_proxy_app(args.upstream, provider, plain=args.plain),
                    host=host, port=port,
                    log_level="warning")
    finally:
        provider.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
