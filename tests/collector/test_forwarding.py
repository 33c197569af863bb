"""The second hop: records forwarded as OTLP logs (collector/forwarder.py,
collector/record_logs.py) and priced from /v1/logs and the gRPC LogsService."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator

import grpc
import httpx
import pytest
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs

from testkit.support.loopback_http import LoopbackHTTPServer, QuietHandler
from testkit.support.otlp import export_request, request_span
from tests.collector.conftest import ServiceFactory, wait_for
from tests.collector.cost.helpers import engine_record
from tokenpath import attributes as A
from tokenpath.collector.cost.sources import SourceProgress
from tokenpath.collector.forwarder import ForwarderConfig, RecordForwarder
from tokenpath.collector.receivers.grpc import LOGS_SERVICE
from tokenpath.collector.record_logs import (
    SOURCE_ATTRIBUTE,
    OutgoingProgress,
    decode_records,
    encode_records,
    resource_key,
)
from tokenpath.collector.stats import CollectorStats
from tokenpath.config import ConfigError
from tokenpath.records import RequestRecord

PROTOBUF = {"Content-Type": "application/x-protobuf"}


class _Peer:
    """A pricing collector stand-in: answers each POST with the next planned status."""

    def __init__(self, statuses: list[int], release: threading.Event | None = None) -> None:
        self.bodies: list[bytes] = []
        self.statuses = list(statuses)
        peer = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if release is not None:
                    release.wait(30)
                status = peer.statuses.pop(0) if peer.statuses else 200
                if status == 200:
                    peer.bodies.append(body)
                payload = ExportLogsServiceResponse().SerializeToString()
                self.send_response(status)
                if status in (429, 503):
                    self.send_header("Retry-After", "0")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self._server = LoopbackHTTPServer(Handler)
        self.url = f"{self._server.base_url}/v1/logs"

    def records(self) -> list[RequestRecord]:
        out = []
        for body in self.bodies:
            out += decode_records(ExportLogsServiceRequest.FromString(body)).records
        return out

    def close(self) -> None:
        self._server.shutdown()


@pytest.fixture
def peer_factory() -> Iterator[type[_Peer]]:
    made: list[_Peer] = []

    class Made(_Peer):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            made.append(self)

    yield Made
    for peer in made:
        peer.close()


def _records(n: int, node: str | None = "node-a", first: int = 0) -> list[RequestRecord]:
    out = []
    for i in range(first, first + n):
        record = engine_record(i, 100.0 + i, 0.1, 1.0, node=node or "")
        record.node = node
        record.engine_id = f"engine-{i % 2}"
        out.append(record)
    return out


def test_records_survive_the_round_trip_grouped_by_pricing_unit() -> None:
    records = _records(4) + _records(2, node=None, first=4)
    request = encode_records(records)
    resources = [{kv.key: kv.value.string_value for kv in rl.resource.attributes}
                 for rl in request.resource_logs]
    assert resources == [{A.NODE: "node-a"}, {A.ENGINE_ID: "engine-0"},
                         {A.ENGINE_ID: "engine-1"}]
    assert [sum(len(s.log_records) for s in rl.scope_logs) for rl in request.resource_logs] \
        == [4, 1, 1]
    decoded = decode_records(ExportLogsServiceRequest.FromString(request.SerializeToString()))
    assert decoded.rejected == 0
    assert sorted(r.to_json()["trace_id"] for r in decoded.records) == sorted(
        r.trace_id for r in records)
    by_id = {r.trace_id: r for r in decoded.records}
    for record in records:
        assert by_id[record.trace_id].to_json() == record.to_json()


def test_other_log_records_are_refused_as_partial_success() -> None:
    request = ExportLogsServiceRequest(resource_logs=[ResourceLogs(scope_logs=[ScopeLogs(
        log_records=[LogRecord(body=AnyValue(string_value="hello"))])])])
    request.resource_logs.extend(encode_records(_records(1)).resource_logs)
    decoded = decode_records(request)
    assert (len(decoded.records), decoded.rejected) == (1, 1)
    assert "tokenpath.request_record" in decoded.error_message


def test_the_forwarder_retries_429_and_503_then_delivers(peer_factory: type[_Peer]) -> None:
    peer = peer_factory([503, 429])
    stats = CollectorStats()
    forwarder = RecordForwarder(ForwarderConfig(peer.url), stats)
    forwarder.start()
    for record in _records(10):
        forwarder.consume_record(record)
    forwarder.shutdown()
    assert sorted(r.trace_id for r in peer.records()) == sorted(r.trace_id for r in _records(10))
    assert stats.records_forwarded.value == 10
    assert sum(stats.records_forward_dropped.values()) == 0


def test_a_refused_batch_is_counted_not_retried(peer_factory: type[_Peer]) -> None:
    peer = peer_factory([400])
    stats = CollectorStats()
    forwarder = RecordForwarder(ForwarderConfig(peer.url), stats)
    records = _records(3)
    for record in records:
        forwarder.consume_record(record)  # no thread started: each sent inline, alone
    forwarder.shutdown()
    assert [r.trace_id for r in peer.records()] == [r.trace_id for r in records[1:]]
    assert stats.records_forward_dropped["rejected"] == 1
    assert stats.records_forwarded.value == 2


def test_a_dead_peer_is_retried_then_counted(peer_factory: type[_Peer]) -> None:
    peer = peer_factory([])
    url = peer.url
    peer.close()  # nothing listens there now
    stats = CollectorStats()
    forwarder = RecordForwarder(ForwarderConfig(url, max_retry_seconds=1.0), stats)
    forwarder.start()
    for record in _records(2):
        forwarder.consume_record(record)
    forwarder.shutdown()
    assert stats.records_forward_dropped["retry_expired"] == 2
    assert stats.records_forwarded.value == 0


def test_a_full_queue_makes_the_caller_wait_and_drops_nothing(
        peer_factory: type[_Peer]) -> None:
    release = threading.Event()
    peer = peer_factory([], release)
    stats = CollectorStats()
    forwarder = RecordForwarder(ForwarderConfig(peer.url, max_queue_records=2,
                                                batch_records=1), stats)
    forwarder.start()
    backlog = forwarder.backlog()
    assert backlog.high_water == 1
    done = threading.Event()

    def produce() -> None:
        for record in _records(6):
            forwarder.consume_record(record)
        done.set()

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    # one record held by the stalled peer, one queued: full, so the producer waits
    wait_for(lambda: backlog.depth() == 2)
    assert backlog.over()
    assert producer.is_alive() and not done.is_set()
    release.set()
    assert done.wait(30)
    forwarder.shutdown()
    assert stats.records_forward_dropped.total() == 0
    assert stats.records_forwarded.value == 6
    assert len(peer.records()) == 6


def test_past_the_shutdown_deadline_a_full_queue_drops_the_oldest(
        peer_factory: type[_Peer]) -> None:
    release = threading.Event()
    peer = peer_factory([], release)
    stats = CollectorStats()
    forwarder = RecordForwarder(ForwarderConfig(peer.url, max_queue_records=2,
                                                batch_records=1, shutdown_seconds=0), stats)
    forwarder.start()
    forwarder.begin_shutdown()  # the deadline is now: nobody waits for room any more
    for record in _records(6):
        forwarder.consume_record(record)
    release.set()
    forwarder.shutdown()
    dropped = stats.records_forward_dropped["queue_full"]
    assert dropped >= 4
    assert (stats.records_forwarded.value + dropped
            + stats.records_forward_dropped["shutdown"]) == 6
    assert len(peer.records()) == stats.records_forwarded.value


def test_forward_records_must_be_an_http_url() -> None:
    with pytest.raises(ConfigError, match="forward_records"):
        ForwarderConfig("collector-2:4318").validate()


def test_a_collector_prices_records_posted_to_v1_logs(make_service: ServiceFactory) -> None:
    service = make_service()
    records = _records(5)
    response = httpx.post(f"{service.http_url}/v1/logs", headers=PROTOBUF,
                          content=encode_records(records).SerializeToString())
    assert response.status_code == 200
    assert ExportLogsServiceResponse.FromString(response.content).partial_success \
        .rejected_log_records == 0
    wait_for(lambda: service.store.count() == 5)
    stored = {r.trace_id: r for r in service.store.records()}
    assert all(stored[r.trace_id].gpu_cost_dollars > 0 for r in records)
    assert service.stats.records_received["otlp_http"] == 5


def test_a_malformed_logs_body_is_400_with_a_status(make_service: ServiceFactory) -> None:
    service = make_service()
    response = httpx.post(f"{service.http_url}/v1/logs", headers=PROTOBUF,
                          content=b"\xff\xff\xff\x0f garbage")
    assert response.status_code == 400
    assert status_pb2.Status.FromString(response.content).code == code_pb2.INVALID_ARGUMENT


def test_the_grpc_logs_service_prices_records(make_service: ServiceFactory) -> None:
    service = make_service()
    assert service.grpc_endpoint is not None
    with grpc.insecure_channel(service.grpc_endpoint) as channel:
        call = channel.unary_unary(f"/{LOGS_SERVICE}/Export", request_serializer=None,
                                   response_deserializer=ExportLogsServiceResponse.FromString)
        call(encode_records(_records(3)).SerializeToString(), timeout=10)
    wait_for(lambda: service.store.count() == 3)


def test_a_forwarding_collector_prices_nothing_itself(make_service: ServiceFactory) -> None:
    pricer = make_service()
    mapper = make_service(forward_records=f"{pricer.http_url}/v1/logs")
    response = httpx.post(f"{mapper.http_url}/v1/traces", headers=PROTOBUF,
                          content=export_request([request_span()]).SerializeToString())
    assert response.status_code == 200
    wait_for(lambda: pricer.store.count() == 1, timeout=30)
    assert mapper.store.count() == 0
    assert mapper.stats.records_forwarded.value == 1


def test_shutdown_keeps_its_deadline_against_a_slow_peer(peer_factory: type[_Peer]) -> None:
    peer = peer_factory([503] * 1000)  # never takes anything
    stats = CollectorStats()
    forwarder = RecordForwarder(ForwarderConfig(peer.url, batch_records=1,
                                                shutdown_seconds=0.5, timeout_seconds=2),
                                stats)
    forwarder.start()
    for record in _records(20):
        forwarder.consume_record(record)
    forwarder.shutdown()  # would retry for max_retry_seconds (300 s) past its deadline
    assert stats.records_forward_dropped["shutdown"] == 20
    assert stats.records_forwarded.value == 0


def test_progress_travels_on_the_units_resource_naming_its_replica_in_attributes() -> None:
    """Progress messages beside the records: same resource (the router's hash sees the
    unit alone), the replica in each log record's attributes, decoded with the unit."""
    records = _records(2)
    progress = OutgoingProgress(resource_key("node-a", None), 2, 101.5)
    final = OutgoingProgress(resource_key(None, "engine-9"), 0, -math.inf, final=True)
    request = encode_records([*records, progress, final], "replica-1", 200.0)
    resources = [{kv.key: kv.value.string_value for kv in rl.resource.attributes}
                 for rl in request.resource_logs]
    assert resources == [{A.NODE: "node-a"}, {A.ENGINE_ID: "engine-9"}]
    for resource_logs in request.resource_logs:
        for log in resource_logs.scope_logs[0].log_records:
            assert {kv.key: kv.value.string_value for kv in log.attributes}[
                SOURCE_ATTRIBUTE] == "replica-1"
    decoded = decode_records(ExportLogsServiceRequest.FromString(request.SerializeToString()))
    assert decoded.rejected == 0
    assert decoded.sources == ["replica-1", "replica-1"]
    assert decoded.progress == [SourceProgress("node-a", "replica-1", 2, 101.5),
                                SourceProgress("engine-9", "replica-1", 0, -math.inf, True)]


def test_malformed_progress_is_refused_and_nothing_else_is_lost() -> None:
    request = encode_records([*_records(1), OutgoingProgress(resource_key("node-a", None), 1,
                                                             5.0)], "replica-1", 1.0)
    logs = request.resource_logs[0].scope_logs[0].log_records
    bad = LogRecord()
    bad.CopyFrom(logs[1])
    del bad.attributes[:]  # no source, no count, no watermark
    logs.append(bad)
    decoded = decode_records(request)
    assert (len(decoded.records), len(decoded.progress), decoded.rejected) == (1, 1, 1)
    assert SOURCE_ATTRIBUTE in decoded.error_message


def test_the_forwarder_sends_progress_each_tick_and_a_final_one_at_shutdown(
        peer_factory: type[_Peer]) -> None:
    peer = peer_factory([])
    stats = CollectorStats()
    forwarder = RecordForwarder(ForwarderConfig(peer.url, source_id="replica-7"), stats)
    for record in _records(3):
        forwarder.consume_record(record)
    forwarder.tick()
    forwarder.shutdown()
    progress = [m for body in peer.bodies
                for m in decode_records(ExportLogsServiceRequest.FromString(body)).progress]
    assert [(m.unit, m.source, m.records, m.final) for m in progress] == [
        ("node-a", "replica-7", 3, False), ("node-a", "replica-7", 3, True)]
    assert stats.progress_forwarded.value == 2
    assert stats.records_forwarded.value == 3
