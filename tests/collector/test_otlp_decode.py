"""Decoding OTLP spans: shared attribute sets never hand a span another span's values."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from testkit.support.otlp import export_request, make_span, new_trace_id
from tokenpath.collector.limits import IngestLimits
from tokenpath.collector.receivers.otlp_decode import decode_traces

# Small value pools so that equal values of different types (1, 1.0, True) meet often.
SCALARS = st.one_of(st.sampled_from([0, 1, 2]), st.sampled_from([0.0, 1.0, 2.5]),
                    st.booleans(), st.sampled_from(["1", "a", ""]))
VALUES = st.one_of(SCALARS, st.lists(SCALARS, min_size=1, max_size=2))
ATTRIBUTE_SETS = st.dictionaries(st.sampled_from(["x", "y"]), VALUES, min_size=1, max_size=2)


def _typed(value: Any) -> Any:
    """A value with its type spelled out, arrays item by item (as tuples)."""
    if isinstance(value, list | tuple):
        return ("array", tuple(_typed(item) for item in value))
    return (type(value).__name__, value)


@settings(max_examples=200)
@given(st.lists(ATTRIBUTE_SETS, min_size=2, max_size=8))
def test_each_span_gets_exactly_its_own_attribute_values(sets: list[dict[str, Any]]) -> None:
    trace_id = new_trace_id()
    spans = [make_span(trace_id, attrs=attributes) for attributes in sets]
    decoded = decode_traces(export_request(spans), IngestLimits())
    assert len(decoded.spans) == len(sets)
    for sent, span in zip(sets, decoded.spans, strict=True):
        assert {k: _typed(v) for k, v in span.attributes.items()} == {
            k: _typed(v) for k, v in sent.items()}


def test_equal_sets_of_strings_and_numbers_are_shared_between_spans() -> None:
    trace_id = new_trace_id()
    common = {"stage": "router", "thread.id": 1234, "weight": 0.5}
    decoded = decode_traces(export_request(
        [make_span(trace_id, attrs=common) for _ in range(3)]), IngestLimits())
    first, second, third = (span.attributes for span in decoded.spans)
    assert first is second is third  # one dict for the three spans


def test_content_under_other_instrumentations_keys_is_dropped_and_counted() -> None:
    """LiteLLM's, Traceloop's and OpenInference's prompt and completion attributes are
    content as gen_ai.* content is: dropped on ingest, counted, never held."""
    keys = ("llm.openai.messages", "llm.openai.choices", "traceloop.entity.input",
            "traceloop.entity.output", "input.value", "output.value",
            "llm.input_messages.0.message.content", "llm.prompts.0.content")
    span = make_span(new_trace_id(), attrs={**{k: "secret prompt" for k in keys},
                                            "llm.token_count.prompt": 12})
    decoded = decode_traces(export_request([span]), IngestLimits())
    (kept,) = decoded.spans
    assert not any(k in kept.attributes for k in keys)
    assert kept.attributes["llm.token_count.prompt"] == 12  # counts are not content
    assert decoded.content_attributes_dropped == len(keys)
    opted_in = decode_traces(export_request([span]), IngestLimits(keep_content_attributes=True))
    assert opted_in.spans[0].attributes["traceloop.entity.input"] == "secret prompt"
