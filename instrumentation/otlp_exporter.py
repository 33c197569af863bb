"""The OTLP/HTTP span exporter for tokenpath's shims: the OpenTelemetry exporter, encoding
each batch with :mod:`tokenpath.instrumentation.otlp_encoder`, and the batch processor
that encodes each span as it ends.

:class:`TokenpathOTLPSpanExporter` is ``OTLPSpanExporter`` (``opentelemetry-exporter-
otlp-proto-http``) in every respect (endpoint, headers, compression, timeout, retries,
the request size limit, its own export metrics, shutdown), except that a batch's request
body is written by tokenpath's encoder: the same bytes as the stock encoder, at about a
sixth of its CPU (docs/performance.md). In a gateway or an engine
process the exporter's thread shares the interpreter lock with the requests, so its CPU
is the served requests' CPU.

The encoding reads the stock exporter's private internals (its HTTP client, its metrics,
its size check), so it runs only where the installed SDK and exporter are inside the
versions it is tested on (``sdk_compat``: elsewhere every export is the stock one,
counted) and have those internals (the exporter 1.40 and later); where the fast encoder
fails on a batch, the stock encoding runs instead; a failure is counted in
``telemetry_errors`` and logged, never raised. gRPC exporters are not covered: the
gRPC stub takes a protobuf message, not bytes.

:class:`TokenpathBatchSpanProcessor` is the SDK's ``BatchSpanProcessor`` (queue size,
batch size, delay, timeout, drop counting, flush and shutdown all its own) that, in front
of a :class:`TokenpathOTLPSpanExporter`, queues each ended span already encoded (an
``EncodedSpan``: its message bytes and its resource and scope). The span's objects are
then freed as the request ends; queued whole for up to the schedule delay, they outlive
the garbage collector's young generation, and the collector runs more often and longer
for them (docs/performance.md). In front of any other exporter, or on an
SDK without the queue it relies on (the stock processor's ``_batch_processor``) or outside the
tested versions, it is the stock processor.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from tokenpath import attributes as attr
from tokenpath.instrumentation.otlp_encoder import EncodedSpan, encode_export_request, encode_span
from tokenpath.instrumentation.safety import telemetry_errors
from tokenpath.instrumentation.sdk_compat import EXPORTER_IN_TESTED_RANGE, fast_path

logger = logging.getLogger(__name__)

# What the override below uses of the stock exporter (opentelemetry-exporter-otlp-proto-
# http 1.40 and later); without all of them the stock ``export`` runs.
_REQUIRED_INTERNALS = ("_metrics", "_client", "_max_request_size", "_shutdown")

# a private module of the exporter (1.40 and later): its request size check and error
_exporter_common: Any = None
if EXPORTER_IN_TESTED_RANGE:
    with contextlib.suppress(ImportError):  # an exporter version without it: None
        from opentelemetry.exporter.otlp.proto.http import _common as _exporter_common


def _no_fast_encoding(exporter: OTLPSpanExporter) -> bool:
    return False


@fast_path("otlp_exporter.fast_encoding", _no_fast_encoding, exporter=True)
def _has_fast_encoding(exporter: OTLPSpanExporter) -> bool:
    """Whether ``exporter`` has the internals :func:`_export` reads."""
    common = _exporter_common
    return (callable(getattr(common, "_is_request_too_large", None))
            and isinstance(getattr(common, "RequestPayloadTooLargeError", None), type)
            and all(hasattr(exporter, name) for name in _REQUIRED_INTERNALS)
            and callable(getattr(exporter._client, "export", None)))


def _stock_export(exporter: TokenpathOTLPSpanExporter,
                  spans: Sequence[ReadableSpan]) -> SpanExportResult:
    return OTLPSpanExporter.export(exporter, spans)


@fast_path("otlp_exporter.export", _stock_export, exporter=True)
def _export(exporter: TokenpathOTLPSpanExporter,
            spans: Sequence[ReadableSpan]) -> SpanExportResult:
    """``exporter.export(spans)`` with tokenpath's encoder, on the stock exporter's
    internals, as its ``export`` does the rest (shutdown, metrics, size limit, sending)."""
    internals: Any = exporter  # the stock exporter's private attributes are untyped
    if not exporter.fast_encoding:
        return OTLPSpanExporter.export(exporter, spans)
    if internals._shutdown:
        logger.warning("Exporter already shutdown, ignoring batch")
        return SpanExportResult.FAILURE
    limit = internals._max_request_size
    with internals._metrics.export_operation(len(spans)) as result:
        try:
            data = _encode(spans)
        except Exception as error:  # the stock encoder failed too: as the stock export
            logger.error("Failed to encode span batch: %s", error)
            result.error = error
            return SpanExportResult.FAILURE
        if _exporter_common._is_request_too_large(data, limit):
            logger.warning("Dropping span batch: serialized size %d bytes exceeds "
                           "max_request_size %d bytes.", len(data), limit)
            result.error = _exporter_common.RequestPayloadTooLargeError(
                f"Serialized span request size {len(data)} bytes exceeds "
                f"max_request_size {limit} bytes.")
            return SpanExportResult.FAILURE
        sent = internals._client.export(data)
        if not sent.success:
            result.error = sent.error
            status = getattr(sent, "status_code", None)
            result.error_attrs = (None if status is None
                                  else {attr.HTTP_RESPONSE_STATUS_CODE: status})
            return SpanExportResult.FAILURE
    return SpanExportResult.SUCCESS


class TokenpathOTLPSpanExporter(OTLPSpanExporter):
    """``OTLPSpanExporter`` (OTLP/HTTP, protobuf) with tokenpath's span encoder."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fast_encoding = _has_fast_encoding(self)
        if not self.fast_encoding:
            logger.info("tokenpath: this OTLP/HTTP exporter version is not the one the "
                        "fast span encoding was built on; spans are encoded by the stock "
                        "encoder")

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Export ``spans`` (and :class:`TokenpathBatchSpanProcessor`'s encoded spans)."""
        return _export(self, spans)


def _no_queue(processor: BatchSpanProcessor) -> Any:
    return None


@fast_path("otlp_exporter.queue", _no_queue)
def _queue(processor: BatchSpanProcessor) -> Any:
    """The stock processor's queue, where it takes any item (``emit``), or None."""
    queue = getattr(processor, "_batch_processor", None)
    return queue if callable(getattr(queue, "emit", None)) else None


def _stock_on_end(processor: TokenpathBatchSpanProcessor, span: ReadableSpan) -> None:
    BatchSpanProcessor.on_end(processor, span)


@fast_path("otlp_exporter.on_end", _stock_on_end)
def _on_end(processor: TokenpathBatchSpanProcessor, span: ReadableSpan) -> None:
    """``processor.on_end(span)``, queueing the span encoded where it can."""
    queue = processor._tokenpath_queue
    if queue is None:
        BatchSpanProcessor.on_end(processor, span)
        return
    context = span.context
    if not (context and context.trace_flags.sampled):
        return
    item: ReadableSpan | EncodedSpan
    try:
        item = encode_span(span)
    except Exception as exc:  # queued as it is: the exporter encodes it, or falls back
        telemetry_errors.count("otlp_exporter.encode_span", exc)
        item = span
    queue.emit(item)


class TokenpathBatchSpanProcessor(BatchSpanProcessor):
    """``BatchSpanProcessor`` that queues spans encoded in front of tokenpath's exporter."""

    def __init__(self, span_exporter: SpanExporter, *args: Any, **kwargs: Any) -> None:
        super().__init__(span_exporter, *args, **kwargs)
        queue = (_queue(self) if isinstance(span_exporter, TokenpathOTLPSpanExporter)
                 and span_exporter.fast_encoding else None)
        # the stock processor's queue, while spans are queued encoded; else None (a name
        # of tokenpath's own: the stock processor's attributes differ between versions)
        self._tokenpath_queue = queue
        self.encodes_at_end = queue is not None

    def on_end(self, span: ReadableSpan) -> None:
        _on_end(self, span)


def _encode(spans: Sequence[ReadableSpan | EncodedSpan]) -> bytes:
    """The request body: tokenpath's encoder, or, where it fails, the stock one for the
    spans not yet encoded (an OTLP request's bytes followed by another's are one request
    with the spans of both)."""
    try:
        return encode_export_request(spans)
    except Exception as exc:
        telemetry_errors.count("otlp_exporter.encode", exc)
        encoded = [span for span in spans if isinstance(span, EncodedSpan)]
        raw = [span for span in spans if not isinstance(span, EncodedSpan)]
        head = encode_export_request(encoded) if encoded else b""
        return head + bytes(encode_spans(raw).SerializePartialToString())
