from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext

from tokenpath.instrumentation.sdk_compat import SDK_IN_TESTED_RANGE
from tokenpath.instrumentation.span_attributes import set_span_attributes

KEYS = st.sampled_from(["a", "b", "tokenpath.status", "http.response.status_code", "", "z"])
VALUES = st.one_of(
    st.text(max_size=12), st.booleans(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False), st.tuples(st.integers()), st.none(), st.binary(max_size=3),
)


def _span(provider: TracerProvider, initial: dict[str, Any]) -> Any:
    return provider.get_tracer("t").start_span("request", attributes=initial)


@settings(max_examples=300, deadline=None)
@given(
    initial=st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(), max_size=3),
    update=st.dictionaries(KEYS, VALUES, max_size=6),
    max_attributes=st.one_of(st.none(), st.integers(0, 8)),
    max_length=st.one_of(st.none(), st.integers(0, 6)),
)
def test_the_fast_path_leaves_a_span_exactly_as_set_attributes_does(
    initial: dict[str, Any], update: dict[str, Any], max_attributes: int | None,
    max_length: int | None,
) -> None:
    limits = SpanLimits(max_span_attributes=max_attributes,
                        max_span_attribute_length=max_length)
    provider = TracerProvider(span_limits=limits, shutdown_on_exit=False)
    by_sdk, by_us = _span(provider, initial), _span(provider, initial)
    by_sdk.set_attributes(update)
    set_span_attributes(by_us, update)
    # the same keys, values and order, and the same drop count
    assert list(by_us.attributes.items()) == list(by_sdk.attributes.items())
    assert by_us.dropped_attributes == by_sdk.dropped_attributes


@pytest.mark.skipif(not SDK_IN_TESTED_RANGE, reason="outside the tested versions: public path")
def test_plain_values_take_the_fast_path_and_others_the_sdk() -> None:
    provider = TracerProvider(shutdown_on_exit=False)
    span = _span(provider, {"a": 1})
    calls: list[dict[str, Any]] = []
    original = span.set_attributes
    span.set_attributes = lambda values: (calls.append(dict(values)), original(values))
    set_span_attributes(span, {"a": 2, "s": "ok", "f": 0.5, "b": True})
    assert calls == []  # written directly
    set_span_attributes(span, {"t": (1, 2)})  # a sequence: the SDK converts and checks it
    assert calls == [{"t": (1, 2)}]
    assert dict(span.attributes) == {"a": 2, "s": "ok", "f": 0.5, "b": True, "t": (1, 2)}


def test_an_ended_span_takes_no_attributes() -> None:
    provider = TracerProvider(shutdown_on_exit=False)
    span = _span(provider, {})
    span.end()
    set_span_attributes(span, {"a": 1})
    assert dict(span.attributes) == {}


def test_a_span_of_another_sdk_gets_the_public_set_attributes() -> None:
    class Recording(NonRecordingSpan):
        def __init__(self) -> None:
            super().__init__(SpanContext(1, 2, False))
            self.got: list[dict[str, Any]] = []

        def set_attributes(self, attributes: Any) -> None:
            self.got.append(dict(attributes))

    span = Recording()
    set_span_attributes(span, {"a": 1})
    assert span.got == [{"a": 1}]



def test_a_span_class_that_sets_attributes_its_own_way_keeps_it() -> None:
    from opentelemetry.sdk.trace import _Span

    class Redacting(_Span):
        def set_attributes(self, attributes: Any) -> None:
            super().set_attributes({k: "redacted" for k in attributes})

    provider = TracerProvider(shutdown_on_exit=False)
    span = _span(provider, {})
    span.__class__ = Redacting
    set_span_attributes(span, {"a": "secret"})
    assert dict(span.attributes) == {"a": "redacted"}
