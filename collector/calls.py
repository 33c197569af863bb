"""One record per LLM call: the spans of a trace split into its calls.

A trace may hold several LLM calls (an agent workflow's steps, a chain), each of which
is a request with its own tokens, GPU time and dollars. The unit is the call:

- call spans are engine spans (vLLM's ``llm_request``, tokenpath's engine hooks), LLM
  gateway server spans (an HTTP server span on an LLM route, or carrying gen_ai.*), and
  GenAI client spans (CLIENT spans with ``gen_ai.operation.name`` or a requested model,
  and OpenInference's LLM spans, INTERNAL, marked ``openinference.span.kind=LLM``);
- a call is a *maximal* call span: one with no call span above it. Its retries (the SDK's
  attempts, a proxy's fallbacks) and the gateway and engine spans under it are part of it,
  and so are the disaggregated prefill and decode engines of one request;
- each call's record holds the subtree of its top: the highest ancestor that leads to no
  other call (a client shim span above a lone gateway call, say), so a trace with one call
  is one record of all its spans, as before;
- spans that lead to several calls (a workflow's root, a tool step between calls) are the
  workflow's context, in no call's record; the records share the trace id, and
  ``/api/traces/{trace_id}`` groups them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from tokenpath import attributes as A
from tokenpath.collector.spans import SPAN_KIND_CLIENT, SPAN_KIND_SERVER, SpanData
from tokenpath.collector.stack_vocabularies import (
    DYNAMO_ENGINE_SPAN,
    GATEWAY_SPAN_NAMES,
    SGLANG_MODULE_ATTRIBUTE,
    SGLANG_REQUEST_MODULE,
    UPSTREAM_SPAN_NAMES,
)

HTTP_SERVER_MARKERS = (A.HTTP_ROUTE, "http.method", A.HTTP_REQUEST_METHOD, "http.target",
                       A.URL_PATH)
HTTP_ROUTE_KEYS = (A.HTTP_ROUTE, A.URL_PATH, "http.target")
# A plain HTTP server span is an LLM call when its route is an LLM API's (OpenAI,
# Anthropic, SGLang/TGI, SageMaker-style) or when it carries a gen_ai.* attribute.
LLM_ROUTE_MARKERS = ("completions", "/chat", "/generate", "/responses", "/messages",
                     "/embeddings", "/invocations", "/infer")
GEN_AI_PREFIX = "gen_ai."


def is_engine_span(span: SpanData) -> bool:
    """vLLM's llm_request, SGLang's request root, Dynamo's engine.generate."""
    name = span.name
    return (name == A.VLLM_REQUEST_SPAN_NAME or name == DYNAMO_ENGINE_SPAN
            or span.attributes.get(SGLANG_MODULE_ATTRIBUTE) == SGLANG_REQUEST_MODULE)


def is_http_server(span: SpanData) -> bool:
    """A gateway's server span: an HTTP SERVER span, or a known LLM front door's (LiteLLM's
    proxy request, Dynamo's frontend, the llm-d / GIE endpoint picker's)."""
    if span.name in GATEWAY_SPAN_NAMES:
        return True
    return (span.kind == SPAN_KIND_SERVER and not is_engine_span(span)
            and _has_http_server_marker(span))


def _has_http_server_marker(span: SpanData) -> bool:
    attributes = span.attributes
    return any(key in attributes for key in HTTP_SERVER_MARKERS)


def route(span: SpanData) -> str:
    for key in HTTP_ROUTE_KEYS:
        value = span.attributes.get(key)
        if isinstance(value, str):
            return value.lower()
    return ""


def is_llm_route(span: SpanData) -> bool:
    path = route(span)
    return any(marker in path for marker in LLM_ROUTE_MARKERS)


def has_gen_ai(span: SpanData) -> bool:
    return any(key.startswith(GEN_AI_PREFIX) for key in span.attributes)


def is_client_call_span(span: SpanData) -> bool:
    """A GenAI client's span of one call: a CLIENT span with ``gen_ai.operation.name`` or a
    requested model (openai-v2, OpenLLMetry, OpenLIT), or an OpenInference LLM span (kind
    INTERNAL, ``openinference.span.kind=LLM``)."""
    attributes = span.attributes
    if span.kind == SPAN_KIND_CLIENT and (A.GEN_AI_OPERATION_NAME in attributes
                                          or A.GEN_AI_REQUEST_MODEL in attributes):
        return True
    return attributes.get(A.OPENINFERENCE_SPAN_KIND) == A.OPENINFERENCE_KIND_LLM


def is_outer_hop_span(span: SpanData) -> bool:
    """A span that makes a record of a call's outer hop without the serving side under it
    (a GenAI client's call, a proxy's upstream call: ``RequestRecord.outer_hop``), which
    the call joiner joins to the serving record (collector/call_join.py)."""
    return is_client_call_span(span) or span.name in UPSTREAM_SPAN_NAMES


def is_call_span(span: SpanData) -> bool:
    """An engine span, an LLM gateway's server span (a front door's, or an HTTP server span
    on an LLM route or carrying gen_ai.*), or a GenAI client span. Engine and front-door
    spans are tested once: a server span past them is not an engine's."""
    if is_engine_span(span) or span.name in GATEWAY_SPAN_NAMES:
        return True
    if span.kind == SPAN_KIND_SERVER and _has_http_server_marker(span):
        return is_llm_route(span) or has_gen_ai(span)
    return is_client_call_span(span)


@dataclass(slots=True)
class Call:
    """The spans of one LLM call and the span its record is named after."""

    top: SpanData
    spans: list[SpanData]


def split_calls(spans: list[SpanData], continued: bool = False) -> list[Call] | None:
    """The trace's calls; None when it holds at most one (the whole trace is the record).

    ``continued``: these spans came after an earlier emission of the trace, so a span
    above a call may lead to calls already recorded: every call is split out, and its
    record is its own subtree (no climbing to shared ancestors)."""
    calls = [s for s in spans if is_call_span(s)]
    if len(calls) < (1 if continued else 2):
        return None
    by_id = {s.span_id: s for s in spans}

    def ancestors(span: SpanData) -> list[SpanData]:
        out: list[SpanData] = []
        seen = {span.span_id}
        parent = by_id.get(span.parent_span_id)
        while parent is not None and parent.span_id not in seen:  # a cycle ends the walk
            out.append(parent)
            seen.add(parent.span_id)
            parent = by_id.get(parent.parent_span_id)
        return out

    call_ids = {s.span_id for s in calls}
    chains = {s.span_id: ancestors(s) for s in calls}
    maximal = [s for s in calls if not any(a.span_id in call_ids for a in chains[s.span_id])]
    if len(maximal) < (1 if continued else 2):
        return None
    leads_to: Counter[str] = Counter()
    for call in maximal:
        for ancestor in chains[call.span_id]:
            leads_to[ancestor.span_id] += 1
    children: dict[str, list[SpanData]] = {}
    for span in spans:
        if span.parent_span_id in by_id and span.parent_span_id != span.span_id:
            children.setdefault(span.parent_span_id, []).append(span)
    out: list[Call] = []
    merged: dict[object, Call] = {}  # engine request id -> its call (P/D: two engines)
    for call in maximal:
        top = call
        for ancestor in () if continued else chains[call.span_id]:
            if leads_to[ancestor.span_id] != 1:
                break
            top = ancestor
        subtree: list[SpanData] = []
        stack, seen = [top], {top.span_id}
        while stack:
            span = stack.pop()
            subtree.append(span)
            for child in children.get(span.span_id, ()):
                if child.span_id not in seen:
                    seen.add(child.span_id)
                    stack.append(child)
        # the engines' request ids: a disaggregated request's prefill and decode engines
        # share one, under whatever spans the proxy put above each (one call)
        request_ids = {s.attributes.get(A.GEN_AI_REQUEST_ID) for s in subtree
                       if is_engine_span(s)} - {None}
        found = next((merged[r] for r in request_ids if r in merged), None)
        if found is not None:
            found.spans.extend(subtree)
        else:
            found = Call(top, subtree)
            out.append(found)
        for request_id in request_ids:
            merged.setdefault(request_id, found)
    return out if len(out) > 1 or continued else None
