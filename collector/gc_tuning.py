"""The collector process's garbage-collector settings.

The collector allocates a few small objects per span and per record (spans, attribute
dicts, stage timings) that almost never form reference cycles, while it holds many
long-lived ones (buffered spans, the cost model's state). With Python's default young
threshold (700 allocations) the cyclic collector runs every few spans and its older
collections walk that whole buffer: in ``bench.pipeline_stages`` a threshold of 50,000
cut the stages' CPU by about an eighth (docs/performance.md). Cycles are still found,
every ``young_threshold`` allocations instead of every 700.

Only the process owner (``tokenpath collector``) applies this: library code never
changes the interpreter's global settings.
"""

from __future__ import annotations

import gc

DEFAULT_GC_YOUNG_THRESHOLD = 50_000


def tune_gc(young_threshold: int) -> None:
    """Set the young generation's threshold (0 keeps Python's own) and move everything
    allocated so far (modules, the started service) out of the collector's walks."""
    if young_threshold > 0:
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(young_threshold, older, oldest)
    gc.collect()
    gc.freeze()
