"""Every ingest limit holds, and every drop shows in /metrics under its reason."""

from __future__ import annotations

import httpx

from testkit.support.otlp import (
    PROTOBUF_HEADERS,
    export_request,
    make_span,
    new_trace_id,
    request_span,
    sample,
)
from tests.collector.conftest import ServiceFactory, wait_for
from tokenpath import attributes as A
from tokenpath import metric_names as M
from tokenpath.collector.assembler import AssemblerConfig
from tokenpath.collector.limits import IngestLimits
from tokenpath.collector.service import CollectorService
from tokenpath.stages import StageId


def _send(service: CollectorService, *spans: object) -> None:
    body = export_request(spans).SerializeToString()  # type: ignore[arg-type]
    response = httpx.post(f"{service.http_url}/v1/traces", content=body,
                          headers=PROTOBUF_HEADERS, timeout=10)
    assert response.status_code == 200


def _metrics(service: CollectorService) -> str:
    return httpx.get(f"{service.http_url}/metrics", timeout=5).text


def test_in_flight_traces_are_capped(make_service: ServiceFactory) -> None:
    held = AssemblerConfig(max_traces=2, root_grace_seconds=600, idle_timeout_seconds=600)
    service = make_service(assembler=held)
    first = new_trace_id()
    _send(service, request_span(first))
    _send(service, request_span(), request_span())  # the third trace evicts the first
    wait_for(lambda: service.store.record(first.hex()) is not None)
    text = _metrics(service)
    assert sample(text, M.TRACES_IN_FLIGHT.name) == 2
    assert sample(text, M.TRACES_EVICTED.series, reason="capacity") == 1
    record = service.store.record(first.hex())
    assert record is not None and record.complete is False


def test_spans_per_trace_are_capped(make_service: ServiceFactory) -> None:
    service = make_service(assembler=AssemblerConfig(max_spans_per_trace=3,
                                                     root_grace_seconds=0.2,
                                                     tick_seconds=0.02))
    trace_id = new_trace_id()
    root = request_span(trace_id)
    _send(service, root, *[make_span(trace_id, parent=root.span_id) for _ in range(5)])
    wait_for(lambda: service.store.record(trace_id.hex()) is not None)
    record = service.store.record(trace_id.hex())
    assert record is not None and record.span_count == 3
    assert sample(_metrics(service), M.SPANS_DROPPED.series, reason="spans_per_trace") == 3


def test_attributes_per_span_and_value_length(make_service: ServiceFactory) -> None:
    limits = IngestLimits(max_attributes_per_span=4, max_attribute_value_length=16)
    service = make_service(limits=limits)
    trace_id = new_trace_id()
    attrs = {f"extra.{i}": "v" for i in range(6)}
    span = make_span(trace_id, name="request",
                     attrs={A.STAGE: StageId.ROUTER.value,
                            A.GEN_AI_REQUEST_MODEL: "m" * 40, **attrs,
                            "list": list(range(40))})
    _send(service, span)
    wait_for(lambda: service.store.record(trace_id.hex()) is not None)
    record = service.store.record(trace_id.hex())
    assert record is not None and record.model == "m" * 16  # cut to the value length
    text = _metrics(service)
    # 2 + 6 + 1 attributes, 4 kept: 5 dropped.
    assert sample(text, M.ATTRIBUTES_DROPPED.series, reason="attributes_per_span") == 5
    assert sample(text, M.ATTRIBUTES_DROPPED.series, reason="value_truncated") == 1


def test_array_values_are_cut_to_the_value_length(make_service: ServiceFactory) -> None:
    service = make_service(limits=IngestLimits(max_attribute_value_length=8))
    trace_id = new_trace_id()
    _send(service, request_span(trace_id, model="m",
                                attrs={A.PREFIX_FINGERPRINTS: [f"{i:x}" for i in range(30)]}))
    wait_for(lambda: service.store.record(trace_id.hex()) is not None)
    record = service.store.record(trace_id.hex())
    assert record is not None and len(record.prefix_fingerprints) == 8
    assert sample(_metrics(service), M.ATTRIBUTES_DROPPED.series, reason="value_truncated") == 1


def test_events_per_span_are_capped(make_service: ServiceFactory) -> None:
    service = make_service(limits=IngestLimits(max_events_per_span=2))
    trace_id = new_trace_id()
    events = [(A.STAGE_EVENT, {A.STAGE: StageId.KV_CACHE_LOOKUP.value, A.STAGE_SECONDS: 0.5})
              for _ in range(5)]
    _send(service, request_span(trace_id, events=events))
    wait_for(lambda: service.store.record(trace_id.hex()) is not None)
    record = service.store.record(trace_id.hex())
    assert record is not None
    assert record.stages[StageId.KV_CACHE_LOOKUP].seconds == 1.0  # two events kept
    assert sample(_metrics(service), M.SPAN_EVENTS_DROPPED.series,
                  reason="events_per_span") == 3


def test_label_cardinality_is_capped(make_service: ServiceFactory) -> None:
    service = make_service(limits=IngestLimits(max_label_values=2))
    for i in range(5):
        _send(service, request_span(model=f"model-{i}", attrs={A.STATUS: f"status-{i}"}))
    wait_for(lambda: service.stats.records_stored.value == 5)
    text = _metrics(service)
    assert sample(text, M.REQUESTS.series, model="model-0", status="status-0") == 1
    assert sample(text, M.REQUESTS.series, model="model-1", status="status-1") == 1
    assert sample(text, M.REQUESTS.series, model=M.OTHER_LABEL_VALUE,
                  status=M.OTHER_LABEL_VALUE) == 3
    assert sample(text, M.LABEL_OVERFLOW.series, label=M.LABEL_MODEL) == 3
    assert sample(text, M.LABEL_OVERFLOW.series, label=M.LABEL_STATUS) == 3
    assert "model-4" not in text and "status-4" not in text
