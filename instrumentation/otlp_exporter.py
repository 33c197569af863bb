"""The OTLP/HTTP span exporter for tokenpath's shims: the OpenTelemetry exporter, encoding
each batch with :mod:`tokenpath.instrumentation.otlp_encoder`, and the batch processor
that encodes each span as it ends.

:class:`TokenpathOTLPSpanExporter` is ``OTLPSpanExporter`` (``opentelemetry-exporter-
otlp-proto-http``) in every respect (endpoint, headers, compression, timeout, retries,
the request size limit, its own export metrics, shutdown), except that a batch's request
body is written by tokenpath's encoder: the same bytes as the stock encoder, at about a
sixth of its CPU (docs/performance.md, seventh A5 run). In a gateway or an engine
process the exporter's thread shares the interpreter lock with the requests, so its CPU
is the served requests' CPU.

Where the installed exporter lacks the internals this relies on (another version), or
the fast encoder fails on a batch, the stock encoding runs instead; a failure is counted
in ``telemetry_errors`` and logged, never raised. gRPC exporters are not covered: the
gRPC stub takes a protobuf message, not bytes.

:class:`TokenpathBatchSpanProcessor` is the SDK's ``BatchSpanProcessor`` (queue size,
batch size, delay, timeout, drop counting, flush and shutdown all its own) that, in front
of a :class:`TokenpathOTLPSpanExporter`, queues each ended span already encoded (an
``EncodedSpan``: its message bytes and its resource and scope). The span's objects are
then freed as the request ends; queued whole for up to the schedule delay, they outlive
the garbage collector's young generation, and the collector runs more often and longer
for them (docs/performance.md, seventh A5 run). In front of any other exporter it is the
stock processor.
"""

from __future__ import annotations

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

logger = logging.getLogger(__name__)

# What the override below uses of the stock exporter (opentelemetry-exporter-otlp-proto-
# http 1.40 and later); without all of them the stock ``export`` runs.
_REQUIRED_INTERNALS = ("_metrics", "_client", "_max_request_size", "_shutdown")

try:
    from opentelemetry.exporter.otlp.proto.http._common import (
        RequestPayloadTooLargeError,
        _is_request_too_large,
    )
except ImportError:  # pragma: no cover - an exporter version without them
    RequestPayloadTooLargeError = None  # type: ignore[assignment,misc]
    _is_request_too_large = None  # type: ignore[assignment]


class TokenpathOTLPSpanExporter(OTLPSpanExporter):
    """``OTLPSpanExporter`` (OTLP/HTTP, protobuf) with tokenpath's span encoder."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fast_encoding = (
            _is_request_too_large is not None
            and all(hasattr(self, name) for name in _REQUIRED_INTERNALS)
            and callable(getattr(self._client, "export", None))
        )
        if not self.fast_encoding:
            logger.info("tokenpath: this OTLP/HTTP exporter version is not the one the "
                        "fast span encoding was built on; spans are encoded by the stock "
                        "encoder")

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Export ``spans`` (and :class:`TokenpathBatchSpanProcessor`'s encoded spans)."""
        if not self.fast_encoding:
            return super().export(spans)
        if self._shutdown:
            logger.warning("Exporter already shutdown, ignoring batch")
            return SpanExportResult.FAILURE
        with self._metrics.export_operation(len(spans)) as result:
            try:
                data = _encode(spans)
            except Exception as error:  # the stock encoder failed too: as the stock export
                logger.error("Failed to encode span batch: %s", error)
                result.error = error
                return SpanExportResult.FAILURE
            if _is_request_too_large(data, self._max_request_size):
                logger.warning("Dropping span batch: serialized size %d bytes exceeds "
                               "max_request_size %d bytes.", len(data), self._max_request_size)
                result.error = RequestPayloadTooLargeError(
                    f"Serialized span request size {len(data)} bytes exceeds "
                    f"max_request_size {self._max_request_size} bytes.")
                return SpanExportResult.FAILURE
            sent = self._client.export(data)
            if not sent.success:
                result.error = sent.error
                status = getattr(sent, "status_code", None)
                result.error_attrs = (None if status is None
                                      else {attr.HTTP_RESPONSE_STATUS_CODE: status})
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS


class TokenpathBatchSpanProcessor(BatchSpanProcessor):
    """``BatchSpanProcessor`` that queues spans encoded in front of tokenpath's exporter."""

    def __init__(self, span_exporter: SpanExporter, *args: Any, **kwargs: Any) -> None:
        super().__init__(span_exporter, *args, **kwargs)
        queue = getattr(self, "_batch_processor", None)
        self.encodes_at_end = (
            isinstance(span_exporter, TokenpathOTLPSpanExporter)
            and span_exporter.fast_encoding
            and callable(getattr(queue, "emit", None))
        )

    def on_end(self, span: ReadableSpan) -> None:
        if not self.encodes_at_end:
            super().on_end(span)
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
        self._batch_processor.emit(item)  # type: ignore[arg-type]

    def on_end_encoded(self, span: EncodedSpan) -> None:
        """Queue a sampled span its writer encoded itself (the gateway's, see
        ``gateway_span``), as ``on_end`` queues the spans it encodes. Only where
        ``encodes_at_end``: the exporter behind it must take encoded spans."""
        self._batch_processor.emit(span)  # type: ignore[arg-type]


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
