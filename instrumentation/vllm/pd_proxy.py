"""A P/D proxy in front of a vLLM prefill engine and a vLLM decode engine.

The shape of vLLM's disaggregated-serving proxies (examples/online_serving/
disaggregated_serving): each completion is sent first to the prefill engine with
``max_tokens: 1`` (and ``kv_transfer_params: {"do_remote_decode": true}``), then to the
decode engine with the ``kv_transfer_params`` the prefill engine returned, if any, both
under one ``X-Request-Id`` and the proxy's ``traceparent``, so the two engines' ``llm_request``
spans land in the proxy's trace under one request id. The KV connector (ExampleConnector,
NIXL, ...) moves the prompt's KV between them.

On its server span the proxy records, as a gateway shim does (never content), the request's
model, the decode response's usage, and ``tokenpath.kv_transfer.tokens``: the prompt tokens
the decode engine reports it did not compute (``usage.prompt_tokens_details.
cached_tokens``, with vLLM's ``--enable-prompt-tokens-details``): the KV that came from the
prefill engine, where the decode engine had none of the prompt cached itself.

``python -m tokenpath.instrumentation.vllm.pd_proxy --prefill URL --decode URL --listen
HOST:PORT --otlp HOST:PORT`` runs it (OTLP/gRPC to the collector). Non-streamed
completions only: a test stand-in, not a production proxy.
"""

from __future__ import annotations

import argparse
import json
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
from tokenpath.instrumentation.llm_payload import response_attributes
from tokenpath.instrumentation.request_ids import REQUEST_ID_HEADER, request_id_for
from tokenpath.instrumentation.safety import telemetry_errors

PD_PROXY_SERVICE_NAME = "tokenpath-vllm-pd-proxy"
COMPLETIONS_ROUTE = "/v1/completions"
HEALTH_ROUTE = "/health"
UNTRACED_URLS = "/health"
UPSTREAM_TIMEOUT_SECONDS = 120.0
KV_TRANSFER_PARAMS = "kv_transfer_params"


def _cached_tokens(payload: dict[str, Any]) -> int | None:
    usage = payload.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) else None


def build_pd_proxy_app(prefill_url: str, decode_url: str,
                       tracer_provider: TracerProvider) -> FastAPI:
    """The proxy app; ``tracer_provider`` receives its server spans."""
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    prefill = httpx.AsyncClient(base_url=prefill_url.rstrip("/"),
                                timeout=UPSTREAM_TIMEOUT_SECONDS)
    decode = httpx.AsyncClient(base_url=decode_url.rstrip("/"),
                               timeout=UPSTREAM_TIMEOUT_SECONDS)
    propagator = TraceContextTextMapPropagator()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await prefill.aclose()
        await decode.aclose()

    app = FastAPI(title="tokenpath vLLM P/D proxy (test stand-in)", lifespan=lifespan)

    @app.post(COMPLETIONS_ROUTE)
    async def completions(request: Request) -> Response:
        body = json.loads(await request.body())
        headers = {"content-type": "application/json"}
        propagator.inject(headers)  # the FastAPI server span is current here
        span = trace.get_current_span()
        request_id = request_id_for(span.get_span_context())
        if request_id is not None:
            headers[REQUEST_ID_HEADER] = request_id
        if isinstance(body.get("model"), str):
            span.set_attribute(attr.GEN_AI_REQUEST_MODEL, body["model"])
        first = await prefill.post(COMPLETIONS_ROUTE, headers=headers, json={
            **body, "max_tokens": 1, "stream": False,
            KV_TRANSFER_PARAMS: {"do_remote_decode": True}})
        if first.status_code != 200:
            return Response(first.content, first.status_code,
                            media_type="application/json")
        second_body = dict(body)
        params = first.json().get(KV_TRANSFER_PARAMS)
        if params:
            second_body[KV_TRANSFER_PARAMS] = params
        second = await decode.post(COMPLETIONS_ROUTE, headers=headers, json=second_body)
        if second.status_code == 200:
            try:
                span.set_attributes(response_attributes(second.content))
                cached = _cached_tokens(second.json())
                if cached is not None:
                    span.set_attribute(attr.KV_TRANSFER_TOKENS, cached)
            except Exception as exc:
                telemetry_errors.count("pd_proxy.response_usage", exc)
        return Response(second.content, second.status_code, media_type="application/json")

    @app.get(HEALTH_ROUTE)
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    FastAPIInstrumentor.instrument_app(app, exclude_spans=["receive", "send"],
                                       excluded_urls=UNTRACED_URLS,
                                       tracer_provider=tracer_provider)
    return app


def main(argv: list[str] | None = None) -> int:
    import uvicorn
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prefill", required=True, help="the prefill vLLM's base URL")
    parser.add_argument("--decode", required=True, help="the decode vLLM's base URL")
    parser.add_argument("--listen", default="127.0.0.1:8080")
    parser.add_argument("--otlp", default=COLLECTOR_GRPC, help="collector OTLP/gRPC")
    args = parser.parse_args(argv)
    host, port = parse_host_port(args.listen, "--listen")
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: PD_PROXY_SERVICE_NAME}))
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=args.otlp, insecure=True),
                           schedule_delay_millis=200))
    try:
        uvicorn.run(build_pd_proxy_app(args.prefill, args.decode, provider), host=host,
                    port=port, log_level="warning")
    finally:
        provider.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
