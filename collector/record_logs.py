"""Request records as OTLP log records: the second hop of a sharded deployment.

A replica started with ``--forward-records URL`` does not price its records: it exports
each as one OTLP LogRecord (``event_name`` ``tokenpath.request_record``, the record's JSON
as the body, its trace id, its end time), grouped into one ResourceLogs per pricing unit
whose resource attributes are that unit's identity and nothing else
(:func:`tokenpath.identity.pricing_resource`). A router hashing the resource (the
OpenTelemetry Collector's loadbalancing exporter, ``routing_key: resource``) sends every
record of one unit to one collector, which prices them exactly as a lone collector would.

Records carry no prompt content (the collector never stores any), so neither does a
forwarded log.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field

import orjson
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs

from tokenpath.identity import pricing_resource
from tokenpath.otlp_values import key_value
from tokenpath.records import RequestRecord

RECORD_EVENT_NAME = "tokenpath.request_record"
RECORD_SCHEMA_ATTRIBUTE = "tokenpath.record.schema"
RECORD_SCHEMA_VERSION = 1
SCOPE_NAME = "tokenpath.collector.forwarder"
SCOPE_VERSION = str(RECORD_SCHEMA_VERSION)


def _log_record(record: RequestRecord) -> LogRecord:
    data = record.to_json()
    try:
        body = orjson.dumps(data).decode()
    except TypeError:  # an integer past 64 bits: the stdlib encoder takes it
        body = json.dumps(data)
    log = LogRecord(time_unix_nano=int(record.end_unix * 1e9), event_name=RECORD_EVENT_NAME,
                    body=AnyValue(string_value=body))
    log.attributes.append(key_value(RECORD_SCHEMA_ATTRIBUTE, RECORD_SCHEMA_VERSION))
    with contextlib.suppress(ValueError):  # 32 hex; anything else stays in the body alone
        log.trace_id = bytes.fromhex(record.trace_id)
    return log


def encode_records(records: Iterable[RequestRecord]) -> ExportLogsServiceRequest:
    """One export: a ResourceLogs per pricing unit, in first-seen order."""
    groups: dict[tuple[tuple[str, str], ...], list[LogRecord]] = {}
    for record in records:
        resource = tuple(sorted(pricing_resource(record.node, record.engine_id).items()))
        groups.setdefault(resource, []).append(_log_record(record))
    request = ExportLogsServiceRequest()
    for resource, logs in groups.items():
        resource_logs = ResourceLogs()
        resource_logs.resource.attributes.extend(key_value(k, v) for k, v in resource)
        scope = ScopeLogs(scope=InstrumentationScope(name=SCOPE_NAME, version=SCOPE_VERSION))
        scope.log_records.extend(logs)
        resource_logs.scope_logs.append(scope)
        request.resource_logs.append(resource_logs)
    return request


@dataclass(slots=True)
class DecodedRecords:
    records: list[RequestRecord] = field(default_factory=list)
    rejected: int = 0
    reasons: list[str] = field(default_factory=list)

    def reject(self, reason: str) -> None:
        self.rejected += 1
        if reason not in self.reasons:
            self.reasons.append(reason)

    @property
    def error_message(self) -> str:
        return "; ".join(self.reasons)


def _schema(log: LogRecord) -> int | None:
    for kv in log.attributes:
        if kv.key == RECORD_SCHEMA_ATTRIBUTE:
            return kv.value.int_value if kv.value.HasField("int_value") else None
    return None


def decode_records(request: ExportLogsServiceRequest) -> DecodedRecords:
    """The request records in an export; any other log record is refused (partial
    success): this endpoint prices records, it is not a log store."""
    out = DecodedRecords()
    for resource_logs in request.resource_logs:
        for scope_logs in resource_logs.scope_logs:
            for log in scope_logs.log_records:
                if log.event_name != RECORD_EVENT_NAME:
                    out.reject(f"not a {RECORD_EVENT_NAME} log record")
                    continue
                if _schema(log) != RECORD_SCHEMA_VERSION:
                    out.reject(f"{RECORD_SCHEMA_ATTRIBUTE} must be {RECORD_SCHEMA_VERSION}")
                    continue
                if not log.body.HasField("string_value"):
                    out.reject("a record's body must be its JSON as a string")
                    continue
                try:
                    data = orjson.loads(log.body.string_value)
                    if not isinstance(data, dict):
                        raise TypeError("not an object")
                    out.records.append(RequestRecord.from_json(data))
                except (orjson.JSONDecodeError, TypeError, ValueError, KeyError,
                        AttributeError) as exc:
                    out.reject(f"malformed record body: {exc}")
    return out
