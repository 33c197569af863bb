"""Coverage-guided fuzz target for the OTLP decoders (atheris).

Not part of ``make test``; the hypothesis tests in tests/collector/test_fuzz.py cover the
same surface in CI. Run it by hand for as long as you like:

    .venv/bin/pip install atheris          # needs a clang-built CPython on some systems
    .venv/bin/python fuzz/otlp_fuzz.py -max_total_time=600 -rss_limit_mb=2048 fuzz/corpus

The target feeds each input to the code both receivers run for a request body: the
protobuf and the OTLP/JSON parsers, then decoding under the ingest limits, then stage
mapping of the decoded spans. The only exception allowed out is ``MalformedPayload``
(the receivers' 400 / INVALID_ARGUMENT); anything else is a crash atheris reports. The
native decoder, where built, must return what the reference returns (compared by repr,
which tells 1 from 1.0 from True and shows NaN; rejection reasons in sorted order) or
leave the input to it. fuzz/otlp_native_fuzz.py compares the two decoders alone, with
structure-aware edits too.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import replace

from tokenpath.collector.assembler import AssembledTrace
from tokenpath.collector.limits import IngestLimits
from tokenpath.collector.mapping import map_trace
from tokenpath.collector.receivers.otlp_decode import (
    DecodedSpans,
    MalformedPayload,
    decode_metrics,
    decode_native,
    decode_traces,
    parse_metrics_request,
    parse_trace_request,
)

LIMITS = IngestLimits()


def _canonical(decoded: DecodedSpans) -> str:
    """The repr compared, with the rejection reasons in sorted order: the reference counts
    them in the order it meets them, the native decoder in a fixed one, and neither the
    error message nor the counters depend on it."""
    return repr(replace(decoded, rejection_reasons=dict(sorted(
        decoded.rejection_reasons.items()))))


def test_one_input(data: bytes) -> None:
    kind = "json" if data[:1] == b"{" else "protobuf"
    compiled = decode_native(data, LIMITS) if kind == "protobuf" else None
    try:
        request = parse_trace_request(data, kind)
    except MalformedPayload:
        if compiled is not None:
            raise AssertionError("the native decoder accepted what protobuf refuses") from None
    else:
        decoded = decode_traces(request, LIMITS)
        if compiled is not None and _canonical(compiled) != _canonical(decoded):
            raise AssertionError("the native decoder differs from the reference")
        by_trace: dict[str, list[object]] = {}
        for span in decoded.spans:
            by_trace.setdefault(span.trace_id, []).append(span)
        for trace_id, spans in by_trace.items():
            map_trace(AssembledTrace(trace_id, spans, complete=True))  # type: ignore[arg-type]
    with contextlib.suppress(MalformedPayload):
        decode_metrics(parse_metrics_request(data, kind), LIMITS)


def main() -> None:
    import atheris  # type: ignore[import-not-found, unused-ignore]

    atheris.instrument_all()
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
