"""The OTLP/HTTP span exporter for tokenpath's shims: the OpenTelemetry exporter, encoding
each batch with :mod:`tokenpath.instrumentation.otlp_encoder`.

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
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from tokenpath import attributes as attr
from tokenpath.instrumentation.otlp_encoder import encode_export_request
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


def _encode(spans: Sequence[ReadableSpan]) -> bytes:
    """The request body: tokenpath's encoder, or the stock one where it fails."""
    try:
        return encode_export_request(spans)
    except Exception as exc:
        telemetry_errors.count("otlp_exporter.encode", exc)
        return bytes(encode_spans(spans).SerializePartialToString())
