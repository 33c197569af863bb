"""Hypothesis feeds valid, mutated and random OTLP (protobuf and JSON) to both receivers:
the answer is 200 or 400, never a 5xx, a crash or a failure further down the pipeline."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

if TYPE_CHECKING:
    from starlette.testclient import TestClient

from testkit.support.otlp import JSON_HEADERS, PROTOBUF_HEADERS, to_otlp_json_dict
from testkit.support.otlp_strategies import mutated_bytes, trace_requests
from tests.collector.conftest import FAST_ASSEMBLER, wait_for
from tokenpath.collector.config import CollectorConfig
from tokenpath.collector.limits import IngestLimits
from tokenpath.collector.receivers.grpc import METRICS_SERVICE, TRACE_SERVICE
from tokenpath.collector.service import CollectorService

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                     | st.text(max_size=10),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)


def _mutate_tree(node: Any, data: st.DataObject, depth: int = 0) -> Any:
    """Replace one node (chosen by walking down) with a random JSON value, or an id with
    a random string, or add an unknown field."""
    if depth > 12 or not isinstance(node, dict | list) or not node or data.draw(
            st.integers(0, 5)) == 0:
        return data.draw(_JSON | st.text(alphabet="0123456789abcdefXYZ", max_size=40))
    if isinstance(node, dict):
        if data.draw(st.integers(0, 6)) == 0:
            return {**node, data.draw(st.text(max_size=8)): data.draw(_JSON)}
        key = data.draw(st.sampled_from(sorted(node)))
        return {**node, key: _mutate_tree(node[key], data, depth + 1)}
    index = data.draw(st.integers(0, len(node) - 1))
    return [*node[:index], _mutate_tree(node[index], data, depth + 1), *node[index + 1:]]


def _json_safe(node: Any) -> Any:
    """OTLP/JSON from MessageToDict may hold NaN/inf as strings already; keep it JSON."""
    if isinstance(node, float) and not math.isfinite(node):
        return str(node)
    return node


# --- the receivers under test ----------------------------------------------------------


@pytest.fixture(scope="module")
def service() -> Iterator[CollectorService]:
    config = CollectorConfig(http_port=0, grpc_port=0, store_path=":memory:",
                             assembler=FAST_ASSEMBLER,
                             limits=IngestLimits(max_body_bytes=256 * 1024))
    collector = CollectorService(config)
    collector.start()
    yield collector
    wait_for(lambda: collector.stats.spans_buffered.value == 0, timeout=30)
    # the store writes on its own thread: the valid examples' records, once it has
    wait_for(lambda: collector.stats.records_stored.value > 0, timeout=60)
    # Nothing failed further down: mapping, sinks and the store took every trace.
    assert collector.stats.spans_dropped["mapping_error"] == 0
    assert collector.stats.pipeline_errors["trace"] == 0
    assert collector.stats.store_errors.value == 0
    assert collector.stats.records_stored.value > 0  # valid examples went all the way through
    collector.shutdown()


@pytest.fixture(scope="module")
def client(service: CollectorService) -> Iterator[TestClient]:
    from starlette.testclient import TestClient  # deprecated with httpx: warns on import

    with TestClient(service.app, raise_server_exceptions=True) as test_client:
        yield test_client


def _check_http(client: TestClient, body: bytes, headers: dict[str, str]) -> None:
    response = client.post("/v1/traces", content=body, headers=headers)
    assert response.status_code in (200, 400), response.text
    if response.status_code == 200:
        message = ExportTraceServiceResponse()
        if headers is JSON_HEADERS:
            json.loads(response.text)
        else:
            message.ParseFromString(response.content)
    assert client.get("/metrics").status_code == 200


@FUZZ
@given(request=trace_requests(), data=st.data())
def test_http_protobuf(client: TestClient, request: ExportTraceServiceRequest,
                       data: st.DataObject) -> None:
    body = request.SerializeToString()
    _check_http(client, body, PROTOBUF_HEADERS)
    _check_http(client, data.draw(mutated_bytes(body)), PROTOBUF_HEADERS)


@FUZZ
@given(request=trace_requests(), data=st.data())
def test_http_json(client: TestClient, request: ExportTraceServiceRequest,
                   data: st.DataObject) -> None:
    document = to_otlp_json_dict(request)
    body = json.dumps(document, default=_json_safe).encode()
    _check_http(client, body, JSON_HEADERS)
    mutated = _mutate_tree(document, data)
    _check_http(client, json.dumps(mutated).encode(), JSON_HEADERS)
    _check_http(client, data.draw(mutated_bytes(body)), JSON_HEADERS)


@FUZZ
@given(body=st.binary(max_size=512))
def test_http_random_bytes(client: TestClient, body: bytes) -> None:
    _check_http(client, body, PROTOBUF_HEADERS)
    _check_http(client, body, JSON_HEADERS)


@pytest.fixture(scope="module")
def channel(service: CollectorService) -> Iterator[grpc.Channel]:
    assert service.grpc_endpoint is not None
    with grpc.insecure_channel(service.grpc_endpoint) as grpc_channel:
        yield grpc_channel


def _check_grpc(channel: grpc.Channel, body: bytes, service_name: str = TRACE_SERVICE) -> None:
    call = channel.unary_unary(f"/{service_name}/Export")
    try:
        call(body, timeout=10)
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err  # type: ignore[attr-defined]


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(request=trace_requests(), data=st.data(), random=st.binary(max_size=256))
def test_grpc(channel: grpc.Channel, request: ExportTraceServiceRequest,
              data: st.DataObject, random: bytes) -> None:
    body = request.SerializeToString()
    _check_grpc(channel, body)
    _check_grpc(channel, data.draw(mutated_bytes(body)))
    _check_grpc(channel, random)
    _check_grpc(channel, random, METRICS_SERVICE)


# What an independent differential fuzz found the native decoder accepting where
# protobuf refuses (tests/collector/test_otlp_native.py has the details): a 6-byte tag, a
# 6-byte length, a span name and an event name whose earlier copy is not UTF-8.
_REFUSED_BY_PROTOBUF = ["8a808080800000", "0a808080808000", "0a09120712052a01ff2a00",
                        "0a0b120912075a051201ff1200"]


@pytest.mark.parametrize("hex_body", _REFUSED_BY_PROTOBUF)
def test_what_protobuf_refuses_is_refused_by_both_receivers(
        client: TestClient, channel: grpc.Channel, hex_body: str) -> None:
    body = bytes.fromhex(hex_body)
    response = client.post("/v1/traces", content=body, headers=PROTOBUF_HEADERS)
    assert response.status_code == 400, response.text
    call = channel.unary_unary(f"/{TRACE_SERVICE}/Export")
    with pytest.raises(grpc.RpcError) as refused:
        call(body, timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]


def _record_logs_body(draw_records: list[int]) -> bytes:
    from tests.collector.cost.helpers import engine_record
    from tokenpath.collector.record_logs import encode_records

    records = [engine_record(i, 1e9 + i, 0.1, float(n % 5)) for i, n in enumerate(draw_records)]
    return encode_records(records).SerializeToString()


@FUZZ
@given(sizes=st.lists(st.integers(0, 50), min_size=1, max_size=5), data=st.data())
def test_http_record_logs(client: TestClient, sizes: list[int], data: st.DataObject) -> None:
    """Forwarded record logs, whole and mutated: 200 (priced or refused as partial
    success) or 400 with a Status, never a 500 or a crash downstream."""
    body = _record_logs_body(sizes)
    for payload in (body, data.draw(mutated_bytes(body))):
        response = client.post("/v1/logs", content=payload, headers=PROTOBUF_HEADERS)
        assert response.status_code in (200, 400), response.text
