"""Set a shim's own attributes on a span: ``span.set_attributes``, cheaper where it can be.

The SDK's ``Span.set_attributes`` sends every value through its cleaning (a recursive
type walk that copies the mapping) and then sets each key under the attribute lock. For
the attributes the shims set at the end of a request (status, byte and chunk counts,
seconds: plain strings, numbers and booleans) that cleaning returns each value unchanged,
so :func:`set_span_attributes` writes them into the SDK span's attribute dict directly,
under the span's lock and then the attributes' lock, as ``set_attributes`` takes them.

It does so only where the result is the SDK's own, key for key and in order: an SDK
span (of a class that does not override ``set_attributes``) still recording, its
``BoundedAttributes`` mutable, every key a non-empty string, every value a ``str``,
``bool``, ``int`` or ``float`` (strings within the span's value length limit), and room
for all of them under the attribute count limit (so nothing is evicted or counted as
dropped). Anything else (an ended span, a tuple value, a full span, another SDK or a
no-op span) gets the public ``set_attributes``. Measured in docs/instrumentation.md and
docs/performance.md (the gateway shim).

The fast path reads the SDK's private internals, so it runs only on the OpenTelemetry
versions it is tested on (``sdk_compat``); on any other every call is the public
``set_attributes``, counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry.attributes import BoundedAttributes as _SdkBoundedAttributes
from opentelemetry.sdk.trace import Span as _SdkSpan  # the SDK is a dependency
from opentelemetry.trace import Span

from tokenpath.instrumentation.sdk_compat import fast_path

_PLAIN_TYPES = frozenset((str, bool, int, float))


def _plain(attributes: Mapping[str, Any], max_value_length: int | None) -> bool:
    """Whether the SDK's cleaning would return every key and value of ``attributes`` as is."""
    for key, value in attributes.items():
        if key.__class__ is not str or not key or value.__class__ not in _PLAIN_TYPES:
            return False
        if (max_value_length is not None and value.__class__ is str
                and len(value) > max_value_length):
            return False
    return True


def _public_set_attributes(span: Span, attributes: Mapping[str, Any]) -> None:
    span.set_attributes(attributes)


@fast_path("span_attributes.set_span_attributes", _public_set_attributes)
def set_span_attributes(span: Span, attributes: Mapping[str, Any]) -> None:
    """``span.set_attributes(attributes)``, by the SDK fast path where it gives the same."""
    store = getattr(span, "_attributes", None)
    span_lock = getattr(span, "_lock", None)
    if (store.__class__ is not _SdkBoundedAttributes or span_lock is None
            # a span class that sets attributes its own way (redacting, hooking) keeps it
            or getattr(type(span), "set_attributes", None) is not _SdkSpan.set_attributes):
        span.set_attributes(attributes)
        return
    try:  # the container's internals as this SDK has them; another version: the public path
        fast = not store._immutable and _plain(attributes, store.max_value_len)
        store_lock, values, maxlen = store._lock, store._dict, store.maxlen
    except AttributeError:
        fast = False
    if fast:
        with span_lock:  # as set_attributes does: an ended span has an end time
            if getattr(span, "_end_time", 0) is None:
                with store_lock:
                    if maxlen is None or len(values) + len(attributes) <= maxlen:
                        for key in attributes:
                            if key in values:  # the SDK moves a key it sets again to the end
                                del values[key]
                        values.update(attributes)
                        return
    span.set_attributes(attributes)
