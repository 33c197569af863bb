"""The agent's fast sample-line parser agrees with prometheus_client's parser."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from testkit.fakes.engine_pages import render_sglang, render_vllm
from tokenpath.agent.prom_text import iter_samples, parse_sample_line


def reference(line: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(line) for s in family.samples]


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@pytest.mark.parametrize("page", [render_vllm(), render_sglang()])
def test_every_sample_line_of_the_fixture_pages_parses_like_the_reference(page: str) -> None:
    lines = [line for line in page.splitlines() if line and not line.startswith("#")]
    assert len(lines) > 10
    for line in lines:
        [(name, labels, value)] = reference(line)
        got = parse_sample_line(line)
        assert got[0] == name and got[1] == labels and same(got[2], value), line


label_names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,12}", fullmatch=True)
label_values = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)
values = st.one_of(
    st.floats(allow_nan=False, allow_infinity=True, width=64),
    st.integers(min_value=-(10**12), max_value=10**12),
)


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_value(value: float) -> str:
    if isinstance(value, float) and math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


@settings(max_examples=300, deadline=None)
@given(name=st.from_regex(r"vllm:[a-z_]{1,20}", fullmatch=True),
       labels=st.dictionaries(label_names, label_values, max_size=4), value=values,
       timestamp=st.booleans())
def test_generated_lines_parse_like_the_reference(name: str, labels: dict[str, str],
                                                  value: float, timestamp: bool) -> None:
    body = ",".join(f'{k}="{escape(v)}"' for k, v in labels.items())
    line = f"{name}{{{body}}} {render_value(value)}" + (" 1700000000000" if timestamp else "")
    try:
        [(ref_name, ref_labels, ref_value)] = reference(line)
    except ValueError:
        assume(False)  # e.g. reserved "__" label names: the reference refuses the line
    got = list(iter_samples(line, ("vllm:",)))
    assert got == [(ref_name, ref_labels, ref_value)] or (
        len(got) == 1 and got[0][:2] == (ref_name, ref_labels) and same(got[0][2], ref_value))


def test_nan_and_label_free_lines() -> None:
    name, labels, value = parse_sample_line("vllm:x NaN")
    assert (name, labels) == ("vllm:x", {}) and math.isnan(value)


def test_garbage_is_rejected_by_both_parsers() -> None:
    with pytest.raises(ValueError):
        list(iter_samples('vllm:x{model_name="m"} not-a-number', ("vllm:",)))


@pytest.mark.parametrize(("line", "expected"), [
    ('vllm:num_requests_running 3 # {trace_id="abc"} 7',
     ("vllm:num_requests_running", {}, 3.0)),
    ('vllm:num_requests_running 3 1700000000000 # {trace_id="abc"} 7 1700000000.5',
     ("vllm:num_requests_running", {}, 3.0)),
    ('vllm:prefix_cache_hits_total{model_name="m"} 10 # {trace_id="abc"} 1.0 1700000000.0',
     ("vllm:prefix_cache_hits_total", {"model_name": "m"}, 10.0)),
    # "#" and "}" inside a label value are not the marker, in the sample or the exemplar.
    ('vllm:num_requests_running{model_name="a # {b}",x="#"} 4 # {trace_id="}#{"} 1',
     ("vllm:num_requests_running", {"model_name": "a # {b}", "x": "#"}, 4.0)),
])
def test_an_exemplar_is_cut_off_before_the_fast_parser_reads_the_line(
        line: str, expected: tuple[str, dict[str, str], float]) -> None:
    assert parse_sample_line(line) == expected
    assert list(iter_samples(line, ("vllm:",))) == [expected]


@settings(max_examples=300, deadline=None)
@given(name=st.from_regex(r"vllm:[a-z_]{1,20}", fullmatch=True),
       labels=st.dictionaries(label_names, label_values, max_size=3), value=values,
       braces=st.booleans(),
       exemplar=st.dictionaries(label_names, label_values, min_size=1, max_size=2))
def test_generated_lines_with_an_exemplar_parse_like_the_line_without_it(
        name: str, labels: dict[str, str], value: float, braces: bool,
        exemplar: dict[str, str]) -> None:
    body = ",".join(f'{k}="{escape(v)}"' for k, v in labels.items())
    line = (f"{name}{{{body}}}" if labels or braces else name) + f" {render_value(value)}"
    try:
        [(ref_name, ref_labels, ref_value)] = reference(line)
    except ValueError:
        assume(False)
    marked = line + " # {" + ",".join(f'{k}="{escape(v)}"' for k, v in exemplar.items()) + "} 1"
    [(got_name, got_labels, got_value)] = list(iter_samples(marked, ("vllm:",)))
    assert (got_name, got_labels) == (ref_name, ref_labels) and same(got_value, ref_value)
