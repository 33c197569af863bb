"""Request records as OTLP log records: the second hop of a sharded deployment.

A replica started with ``--forward-records URL`` does not price its records: it exports
each as one OTLP LogRecord (``event_name`` ``tokenpath.request_record``, the record's JSON
as the body, its trace id, its end time), grouped into one ResourceLogs per pricing unit
whose resource attributes are that unit's identity and nothing else
(:func:`tokenpath.identity.pricing_resource`). A router hashing the resource (the
OpenTelemetry Collector's loadbalancing exporter, ``routing_key: resource``) sends every
record of one unit to one collector, which prices them exactly as a lone collector would.

Beside the records, on the same resource (so the same route carries them), the replica
sends its progress for the unit (``event_name`` ``tokenpath.pricing_progress``, no body):
how many of the unit's records it had sent before, and its watermark for the unit
(collector/cost/sources.py). Every log record names its replica in the attribute
``tokenpath.source.id``, never on the resource, which the router hashes.

Records carry no prompt content (the collector never stores any), so neither does a
forwarded log.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import orjson
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs

from tokenpath import attributes as A
from tokenpath.collector.cost.sources import SourceProgress
from tokenpath.identity import pricing_resource, pricing_unit
from tokenpath.otlp_values import key_value
from tokenpath.records import RequestRecord

RECORD_EVENT_NAME = "tokenpath.request_record"
PROGRESS_EVENT_NAME = "tokenpath.pricing_progress"
# a disaggregated record's prefill part, priced by its unit's collector, on its way to the
# decode unit's collector, which merges it (collector/cost/disaggregated_parts.py)
PRICED_PART_EVENT_NAME = "tokenpath.priced_part"
RECORD_SCHEMA_ATTRIBUTE = "tokenpath.record.schema"
RECORD_SCHEMA_VERSION = 1
SOURCE_ATTRIBUTE = "tokenpath.source.id"  # the forwarding replica (records and progress)
PROGRESS_RECORDS_ATTRIBUTE = "tokenpath.progress.records"
PROGRESS_WATERMARK_ATTRIBUTE = "tokenpath.progress.watermark"  # unix seconds, a double
PROGRESS_FINAL_ATTRIBUTE = "tokenpath.progress.final"
SCOPE_NAME = "tokenpath.collector.forwarder"
SCOPE_VERSION = str(RECORD_SCHEMA_VERSION)

ResourceKey = tuple[tuple[str, str], ...]


def resource_key(node: str | None, engine: str | None) -> ResourceKey:
    """A pricing unit's resource attributes as a hashable key."""
    return tuple(sorted(pricing_resource(node, engine).items()))


@dataclass(frozen=True, slots=True)
class OutgoingProgress:
    """A replica's progress for one unit, as queued beside its records (the forwarder)."""

    resource: ResourceKey
    records: int
    watermark: float
    final: bool = False


@dataclass(frozen=True, slots=True)
class OutgoingPricedPart:
    """A priced part, queued for the decode engine's unit (its resource)."""

    part: RequestRecord


def _progress_log(item: OutgoingProgress, source: str, now_unix: float) -> LogRecord:
    log = LogRecord(time_unix_nano=int(now_unix * 1e9), event_name=PROGRESS_EVENT_NAME)
    log.attributes.append(key_value(SOURCE_ATTRIBUTE, source))
    log.attributes.append(key_value(PROGRESS_RECORDS_ATTRIBUTE, item.records))
    log.attributes.append(key_value(PROGRESS_WATERMARK_ATTRIBUTE, float(item.watermark)))
    if item.final:
        log.attributes.append(key_value(PROGRESS_FINAL_ATTRIBUTE, True))
    return log


def _log_record(record: RequestRecord, source: str | None = None,
                event_name: str = RECORD_EVENT_NAME) -> LogRecord:
    data = record.to_json()
    try:
        body = orjson.dumps(data).decode()
    except TypeError:  # an integer past 64 bits: the stdlib encoder takes it
        body = json.dumps(data)
    log = LogRecord(time_unix_nano=int(record.end_unix * 1e9), event_name=event_name,
                    body=AnyValue(string_value=body))
    log.attributes.append(key_value(RECORD_SCHEMA_ATTRIBUTE, RECORD_SCHEMA_VERSION))
    if source is not None:
        log.attributes.append(key_value(SOURCE_ATTRIBUTE, source))
    with contextlib.suppress(ValueError):  # 32 hex; anything else stays in the body alone
        log.trace_id = bytes.fromhex(record.trace_id)
    return log


def encode_records(items: Iterable[RequestRecord | OutgoingProgress | OutgoingPricedPart],
                   source: str | None = None, now_unix: float = 0.0
                   ) -> ExportLogsServiceRequest:
    """One export: a ResourceLogs per pricing unit, in first-seen order, each unit's
    records and progress in the order given. ``source`` names the replica (required for
    progress); ``now_unix`` stamps the progress log records."""
    groups: dict[ResourceKey, list[LogRecord]] = {}
    for item in items:
        if isinstance(item, OutgoingProgress):
            if source is None:
                raise ValueError("progress needs the replica's source id")
            groups.setdefault(item.resource, []).append(_progress_log(item, source, now_unix))
        elif isinstance(item, OutgoingPricedPart):
            part = item.part
            groups.setdefault(resource_key(part.decode_node, part.decode_engine_id), []).append(
                _log_record(part, source, PRICED_PART_EVENT_NAME))
        else:
            groups.setdefault(resource_key(item.node, item.engine_id), []).append(
                _log_record(item, source))
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
    sources: list[str | None] = field(default_factory=list)  # each record's replica
    progress: list[SourceProgress] = field(default_factory=list)
    priced_parts: list[RequestRecord] = field(default_factory=list)
    rejected: int = 0
    reasons: list[str] = field(default_factory=list)

    def reject(self, reason: str) -> None:
        self.rejected += 1
        if reason not in self.reasons:
            self.reasons.append(reason)

    @property
    def error_message(self) -> str:
        return "; ".join(self.reasons)


def _attributes(log: LogRecord) -> dict[str, AnyValue]:
    return {kv.key: kv.value for kv in log.attributes}


def _schema(attributes: dict[str, AnyValue]) -> int | None:
    value = attributes.get(RECORD_SCHEMA_ATTRIBUTE)
    return value.int_value if value is not None and value.HasField("int_value") else None


def _source(attributes: dict[str, AnyValue]) -> str | None:
    value = attributes.get(SOURCE_ATTRIBUTE)
    if value is None or not value.HasField("string_value") or not value.string_value:
        return None
    return value.string_value


def _unit_of(resource_logs: ResourceLogs) -> str:
    resource = {kv.key: kv.value.string_value for kv in resource_logs.resource.attributes}
    return pricing_unit(resource.get(A.NODE) or None, resource.get(A.ENGINE_ID) or None)


def _decode_progress(unit: str, attributes: dict[str, AnyValue], out: DecodedRecords) -> None:
    source = _source(attributes)
    records = attributes.get(PROGRESS_RECORDS_ATTRIBUTE)
    watermark = attributes.get(PROGRESS_WATERMARK_ATTRIBUTE)
    final = attributes.get(PROGRESS_FINAL_ATTRIBUTE)
    if source is None:
        out.reject(f"a progress log record needs a string {SOURCE_ATTRIBUTE}")
    elif records is None or not records.HasField("int_value") or records.int_value < 0:
        out.reject(f"{PROGRESS_RECORDS_ATTRIBUTE} must be an int >= 0")
    elif (watermark is None or not watermark.HasField("double_value")
          or math.isnan(watermark.double_value) or watermark.double_value == math.inf):
        out.reject(f"{PROGRESS_WATERMARK_ATTRIBUTE} must be a double (unix seconds)")
    else:
        out.progress.append(SourceProgress(
            unit, source, records.int_value, watermark.double_value,
            final is not None and final.HasField("bool_value") and final.bool_value))


def decode_records(request: ExportLogsServiceRequest) -> DecodedRecords:
    """The request records and progress messages in an export; any other log record is
    refused (partial success): this endpoint prices records, it is not a log store."""
    out = DecodedRecords()
    for resource_logs in request.resource_logs:
        unit: str | None = None
        for scope_logs in resource_logs.scope_logs:
            for log in scope_logs.log_records:
                attributes = _attributes(log)
                if log.event_name == PROGRESS_EVENT_NAME:
                    if unit is None:
                        unit = _unit_of(resource_logs)
                    _decode_progress(unit, attributes, out)
                    continue
                if log.event_name not in (RECORD_EVENT_NAME, PRICED_PART_EVENT_NAME):
                    out.reject(f"not a {RECORD_EVENT_NAME} or {PROGRESS_EVENT_NAME} log record")
                    continue
                if _schema(attributes) != RECORD_SCHEMA_VERSION:
                    out.reject(f"{RECORD_SCHEMA_ATTRIBUTE} must be {RECORD_SCHEMA_VERSION}")
                    continue
                if not log.body.HasField("string_value"):
                    out.reject("a record's body must be its JSON as a string")
                    continue
                try:
                    data = orjson.loads(log.body.string_value)
                    if not isinstance(data, dict):
                        raise TypeError("not an object")
                    record = RequestRecord.from_json(data)
                    if log.event_name == PRICED_PART_EVENT_NAME:
                        out.priced_parts.append(record)
                    else:
                        out.records.append(record)
                        out.sources.append(_source(attributes))
                except (orjson.JSONDecodeError, TypeError, ValueError, KeyError,
                        AttributeError) as exc:
                    out.reject(f"malformed record body: {exc}")
    return out
