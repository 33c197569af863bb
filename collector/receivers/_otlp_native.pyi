"""Types of the compiled OTLP trace decoder (_otlp_native.c)."""

from tokenpath.collector.spans import SpanData

def decode_traces(
    body: bytes, config: tuple[object, ...]
) -> tuple[list[SpanData], int, int, int, int, int, int, int, int] | None: ...
