"""Hash flooding of the compiled trace decoder's per-request tables (docs/security.md).

The decoder shares trace ids, strings and attribute sets within a request through hash
tables keyed by their wire bytes, which the client chooses. Until it hashed them with
SipHash-1-3 under a per-process random key and bounded its probing, it used a fixed,
unkeyed hash: trace ids chosen to collide under it (:func:`colliding_trace_ids`) put
every span's id on one probe run, and a 2.6 MB request of 80,000 such spans cost 27 s of
CPU against 0.13 s for random ids. This bench decodes a request of ``spans`` spans with
those colliding ids and one of random ids of the same size and reports the ratio of their
decode CPU (target: at most 2x). The attacker's best effort against the keyed hash, which
they cannot know, is no better than any other choice of ids: the colliding ids of the old
hash, and sequential ids (another pattern weak hashes fall to), are measured as such.

    .venv/bin/python -m bench.hash_flood
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

SPANS = 80_000
_MASK = (1 << 64) - 1
# The constants of the fixed hash the decoder used before (hash_bytes in the C file up to
# the commit that keyed it).
_OLD_SEED = 0x9E3779B97F4A7C15
_OLD_LENGTH_MULTIPLIER = 0xFF51AFD7ED558CCD
_OLD_WORD_MULTIPLIER = 0xC4CEB9FE1A85EC53


def old_fixed_hash(data: bytes) -> int:
    """The decoder's former table hash of ``data`` (unkeyed: the same in every process)."""
    n = len(data)
    h = _OLD_SEED ^ (n * _OLD_LENGTH_MULTIPLIER & _MASK)
    whole = n - n % 8
    for i in range(0, whole, 8):
        h = (h ^ int.from_bytes(data[i:i + 8], "little")) * _OLD_WORD_MULTIPLIER & _MASK
        h ^= h >> 29
    h = (h ^ int.from_bytes(data[whole:], "little")) * _OLD_LENGTH_MULTIPLIER & _MASK
    return h ^ (h >> 32)


def colliding_fills(template: bytes, at: int, n: int, seed: int = 0) -> list[bytes]:
    """``n`` distinct copies of ``template`` with one and the same :func:`old_fixed_hash`,
    all 64 bits of it, differing in their 16 bytes from ``at`` (a multiple of 8): the
    first 8 are random, the next 8 undo them. The hash's word step is ``s = (s ^ w) * K``
    then a shift; K is odd, so whatever the state after the first word, one second word
    leads to a chosen product, and from there on every copy hashes alike."""
    if at % 8 or at + 16 > len(template):
        raise ValueError("the 16 bytes to fill must start at a multiple of 8")
    rng = random.Random(seed)
    inverse = pow(_OLD_WORD_MULTIPLIER, -1, 1 << 64)
    target_product = 0x5851F42D4C957F2D  # any fixed value
    state = _OLD_SEED ^ (len(template) * _OLD_LENGTH_MULTIPLIER & _MASK)
    for i in range(0, at, 8):
        state = (state ^ int.from_bytes(template[i:i + 8], "little")) * _OLD_WORD_MULTIPLIER
        state &= _MASK
        state ^= state >> 29
    out: dict[bytes, None] = {}
    while len(out) < n:
        first = rng.getrandbits(64) | 1  # never all zero (a zero trace id is invalid)
        after_first = (state ^ first) * _OLD_WORD_MULTIPLIER & _MASK
        after_first ^= after_first >> 29
        second = after_first ^ (target_product * inverse & _MASK)
        fill = first.to_bytes(8, "little") + second.to_bytes(8, "little")
        out[template[:at] + fill + template[at + 16:]] = None
    return list(out)


def colliding_trace_ids(n: int, seed: int = 0) -> list[bytes]:
    """``n`` distinct, valid 16-byte trace ids with one :func:`old_fixed_hash`."""
    return colliding_fills(bytes(16), 0, n, seed)


# A span whose only attribute is ATTRIBUTE_KEY with a 16-byte bytes value carries this run
# of wire bytes (field 9, the KeyValue, its AnyValue's bytes_value = 7); the decoder keyed
# its attribute-set table by it. The 8-character key puts the value at offset 16.
ATTRIBUTE_KEY = "collide!"
_ATTRIBUTE_RUN = (b"\x4a\x1e" + b"\x0a\x08" + ATTRIBUTE_KEY.encode() + b"\x12\x12"
                  + b"\x3a\x10" + bytes(16))


def attribute_run(value: bytes) -> bytes:
    """The attribute run of a span whose one attribute is ATTRIBUTE_KEY = ``value``."""
    return _ATTRIBUTE_RUN[:16] + value


def colliding_attribute_values(n: int, seed: int = 0) -> list[bytes]:
    """``n`` distinct 16-byte values whose attribute runs (:func:`attribute_run`) have
    one :func:`old_fixed_hash`: spans carrying them have colliding attribute sets."""
    return [run[16:] for run in colliding_fills(_ATTRIBUTE_RUN, 16, n, seed)]


def random_trace_ids(n: int, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    return [(rng.getrandbits(128) | 1).to_bytes(16, "little") for _ in range(n)]


def sequential_trace_ids(n: int) -> list[bytes]:
    """Ids that differ in their last bytes only, counting up."""
    return [(i + 1).to_bytes(16, "big") for i in range(n)]


def old_table_longest_probe(keys: Sequence[bytes], capacity: int = 256) -> int:
    """The longest probe run the decoder's former table would have made for ``keys``: the
    same linear probing and growth at half full, with :func:`old_fixed_hash`."""
    slots: list[int | None] = [None] * capacity
    longest = 0

    def place(table: list[int | None], h: int) -> int:
        mask = len(table) - 1
        i = h & mask
        probes = 1
        while table[i] is not None:
            i = (i + 1) & mask
            probes += 1
        table[i] = h
        return probes

    # distinct keys: a repeated one is found, not added
    for used, key in enumerate(dict.fromkeys(keys), start=1):
        longest = max(longest, place(slots, old_fixed_hash(key)))
        if used * 2 > len(slots):
            bigger: list[int | None] = [None] * (2 * len(slots))
            for h in slots:
                if h is not None:
                    longest = max(longest, place(bigger, h))
            slots = bigger
    return longest


def request_with_trace_ids(trace_ids: Sequence[bytes]) -> bytes:
    """An export request of one span per trace id (span id, name, start and end times):
    about 33 bytes a span."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    spans.extend(Span(trace_id=trace_id, span_id=(i + 1).to_bytes(8, "little"), name="s")
                 for i, trace_id in enumerate(trace_ids))
    return request.SerializeToString()


def run(spans: int = SPANS, rounds: int = 5) -> dict[str, Any]:
    from tokenpath.collector.limits import IngestLimits
    from tokenpath.collector.receivers import otlp_decode

    native = otlp_decode._native
    if native is None:
        raise RuntimeError("the native decoder is not built (setup.py build_ext)")
    limits = IngestLimits()
    bodies = {
        "random": request_with_trace_ids(random_trace_ids(spans)),
        "colliding": request_with_trace_ids(colliding_trace_ids(spans)),
        "sequential": request_with_trace_ids(sequential_trace_ids(spans)),
    }
    result: dict[str, Any] = {"spans": spans, "rounds": rounds}
    for name, body in bodies.items():
        decoded = otlp_decode.decode_native(body, limits, native)
        if decoded is None or len(decoded.spans) != spans:
            raise RuntimeError(f"{name}: the native decoder left the request to the "
                               "reference or lost spans")
        result[f"longest_probe_{name}"] = native.longest_probe()
        result[f"body_bytes_{name}"] = len(body)
    times: dict[str, list[float]] = {name: [] for name in bodies}
    for _ in range(rounds):  # interleaved: drift on a shared machine hits each body alike
        for name, body in bodies.items():
            started = time.process_time()
            otlp_decode.decode_native(body, limits, native)
            times[name].append(time.process_time() - started)
    seconds = {name: statistics.median(values) for name, values in times.items()}
    for name, value in seconds.items():
        result[f"cpu_ms_{name}"] = round(1000 * value, 2)
    result["ratio"] = round(seconds["colliding"] / seconds["random"], 3)
    result["sequential_ratio"] = round(seconds["sequential"] / seconds["random"], 3)
    return result


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
