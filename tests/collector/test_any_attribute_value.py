"""Any value of any kind under any attribute name the collector reads goes through mapping,
the call joiner, pricing and the Prometheus sink without an exception. The compiled core
(tokenpath/compiled.py) checks its annotations at run time, where plain Python would let a
value of an unexpected kind through: this is the check that the code never relies on a
value's kind without testing it first."""

from __future__ import annotations

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from testkit.fakes.spans import span
from tokenpath import attributes as A
from tokenpath import metric_names as M
from tokenpath.collector.assembler import AssembledTrace
from tokenpath.collector.call_join import CallJoiner, JoinConfig
from tokenpath.collector.cost.attributor import AttributorConfig, CostAttributor
from tokenpath.collector.cost.prices import load_price_sheet
from tokenpath.collector.mapping import StageMapper
from tokenpath.collector.prometheus_sink import PrometheusSink
from tokenpath.collector.spans import SPAN_KIND_CLIENT, SPAN_KIND_SERVER, SpanEvent
from tokenpath.collector.stats import CollectorStats
from tokenpath.stages import STAGE_IDS

# every attribute name tokenpath knows (tokenpath/attributes.py is their one table)
KNOWN_KEYS = sorted({value for name, value in vars(A).items()
                     if name.isupper() and isinstance(value, str) and "." in value})
TRACE_ID = "ab" * 16
REQUESTS_TOTAL = M.REQUESTS.series
_SCALARS = (st.text(max_size=12) | st.sampled_from([s.value for s in STAGE_IDS])
            | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=True)
            | st.booleans())
VALUES = _SCALARS | st.tuples(_SCALARS) | st.lists(_SCALARS, max_size=3).map(tuple)
ATTRIBUTES = st.dictionaries(st.sampled_from(KNOWN_KEYS), VALUES, max_size=12)
EVENT_NAMES = st.sampled_from([A.STAGE_EVENT, "e"])
# what a vLLM engine span carries: each example's values override some of it, so most
# examples still make a record that goes on to pricing and the sink
ENGINE_BASE = {A.GEN_AI_REQUEST_MODEL: "llama-3.1-8b", A.GEN_AI_REQUEST_ID: "cmpl-1",
               A.VLLM_USAGE_PROMPT_TOKENS: 1200, A.VLLM_USAGE_COMPLETION_TOKENS: 80,
               A.VLLM_LATENCY_TIME_IN_QUEUE: 0.01, A.VLLM_LATENCY_TIME_TO_FIRST_TOKEN: 0.2,
               A.VLLM_LATENCY_TIME_IN_MODEL_PREFILL: 0.15,
               A.VLLM_LATENCY_TIME_IN_MODEL_DECODE: 1.2, A.SERVICE_INSTANCE_ID: "vllm-0"}


def _priced_records(root: dict[str, object], gateway: dict[str, object],
                    engine: dict[str, object], resource: dict[str, object],
                    events: list[tuple[str, dict[str, object]]], engine_name: str) -> int:
    """One trace of a client, a gateway and an engine span through mapping, the call
    joiner, pricing and the sink; the number of requests the sink counted."""
    stats = CollectorStats()
    sink = PrometheusSink(stats=stats)
    attributor = CostAttributor(sink, load_price_sheet(), clock=lambda: 2000.0,
                                config=AttributorConfig(tick_seconds=0))
    mapper = StageMapper(CallJoiner(attributor, JoinConfig(), stats), stats)
    spans = [
        span(TRACE_ID, "client", span_id="1" * 16, kind=SPAN_KIND_CLIENT, start=1000.0,
             end=1002.0, attributes=root, resource=resource),  # type: ignore[arg-type]
        span(TRACE_ID, "POST /v1/chat/completions", span_id="2" * 16, parent="1" * 16,
             kind=SPAN_KIND_SERVER, start=1000.1, end=1001.9,
             attributes={A.URL_PATH: "/v1/chat/completions", **gateway},  # type: ignore[dict-item]
             events=[SpanEvent(name, 1_000_500_000_000, attrs)  # type: ignore[arg-type]
                     for name, attrs in events]),
        span(TRACE_ID, engine_name, span_id="3" * 16, parent="2" * 16,
             kind=SPAN_KIND_SERVER, start=1000.2, end=1001.8,
             attributes={**ENGINE_BASE, **engine}, resource=resource),  # type: ignore[arg-type]
    ]
    mapper.consume_trace(AssembledTrace(TRACE_ID, spans, True, []))
    mapper.shutdown()  # the joiner and the attributor flush: every record is priced
    # lines end at "\n" only: the exposition format escapes a label value's newlines but
    # not its other line breaks (a "\r" from an attribute stays as it is)
    return sum(int(line.rsplit(" ", 1)[1].split(".")[0])
               for line in sink.render().split("\n")
               if line.startswith(REQUESTS_TOTAL + "{"))


def test_the_trace_the_examples_vary_is_one_priced_request() -> None:
    assert _priced_records({}, {}, {}, {}, [], A.VLLM_REQUEST_SPAN_NAME) == 1


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(root=ATTRIBUTES, gateway=ATTRIBUTES, engine=ATTRIBUTES, resource=ATTRIBUTES,
       events=st.lists(st.tuples(EVENT_NAMES, ATTRIBUTES), max_size=4),
       engine_name=st.sampled_from([A.VLLM_REQUEST_SPAN_NAME, "engine.generate", "x"]))
@example(root={}, gateway={}, engine={}, resource={A.STATUS: "\r"}, events=[],
         engine_name=A.VLLM_REQUEST_SPAN_NAME)  # a line break the exposition leaves as is
def test_any_attribute_value_is_mapped_priced_and_exported_without_an_exception(
        root: dict[str, object], gateway: dict[str, object], engine: dict[str, object],
        resource: dict[str, object], events: list[tuple[str, dict[str, object]]],
        engine_name: str) -> None:
    priced = _priced_records(root, gateway, engine, resource, events, engine_name)
    event(f"requests counted: {priced}")
    assert priced <= 1
