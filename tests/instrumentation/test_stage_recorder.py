from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.trace import NonRecordingSpan, SpanContext

from testkit.fakes.otel_sink import SpanSink, stage_entries
from tokenpath import attributes as attr
from tokenpath.config import ConfigError
from tokenpath.instrumentation.fingerprints import FingerprintConfig, prefix_fingerprints
from tokenpath.instrumentation.safety import TelemetryErrors, guarded, telemetry_errors
from tokenpath.instrumentation.stage_recorder import StageRecorder
from tokenpath.stages import Phase, Provenance, StageId


@pytest.fixture()
def sink() -> SpanSink:
    return SpanSink()


def test_recorded_entries_are_summed_and_flushed_once(sink: SpanSink) -> None:
    span = sink.provider.get_tracer("t").start_span("request")
    recorder = StageRecorder(span)
    recorder.record(StageId.ROUTER, 0.5, end_ns=7)
    recorder.record_all([(StageId.AUTH_RATELIMIT, 0.25, None, None, 8),
                         (StageId.ROUTER, 0.125, None, Provenance.DERIVED, 9)])
    assert recorder.seconds(StageId.ROUTER) == 0.625
    assert recorder.seconds(StageId.ROUTER, StageId.AUTH_RATELIMIT) == 0.875
    assert recorder.seconds(StageId.NIC_TX) == 0.0
    assert [entry[0] for entry in recorder.entries] == [StageId.ROUTER, StageId.AUTH_RATELIMIT,
                                                        StageId.ROUTER]
    recorder.flush()
    recorder.flush()  # once: a second flush writes nothing
    span.end()
    (finished,) = sink.spans()
    assert [event.timestamp for event in finished.events] == [7, 8, 9]


def test_recorder_writes_one_stage_event_per_record_on_one_span(sink: SpanSink) -> None:
    span = sink.provider.get_tracer("t").start_span("request")
    recorder = StageRecorder(span)
    recorder.record(StageId.SCHEDULER_QUEUE, 0.25)
    recorder.record(StageId.GPU_DISPATCH, 0.01, phase=Phase.PREFILL)
    recorder.record(StageId.NIC_TX, 0.002, provenance=Provenance.DERIVED)
    with recorder.stage(StageId.ROUTER):
        pass
    recorder.flush()
    recorder.flush()  # idempotent
    span.end()
    (finished,) = sink.spans()
    events = [e for e in finished.events if e.name == attr.STAGE_EVENT]
    assert len(events) == 4
    entries = list(stage_entries([finished]))
    assert [e[0] for e in entries] == [StageId.SCHEDULER_QUEUE, StageId.GPU_DISPATCH,
                                       StageId.NIC_TX, StageId.ROUTER]
    assert entries[0][1] == 0.25
    assert entries[1][2][attr.PHASE] == Phase.PREFILL.value
    assert entries[2][2][attr.PROVENANCE] == Provenance.DERIVED.value
    assert attr.PROVENANCE not in entries[0][2]  # measured is the default
    assert entries[3][1] >= 0.0


def test_stage_events_respect_the_sdk_span_event_limit() -> None:
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider

    provider = TracerProvider(span_limits=SpanLimits(max_events=3), shutdown_on_exit=False)
    span = provider.get_tracer("t").start_span("request")
    span.add_event("app-event")
    recorder = StageRecorder(span)
    for stage in (StageId.API_GATEWAY, StageId.SCHEDULER_QUEUE, StageId.GPU_DISPATCH):
        recorder.record(stage, 0.1)
    recorder.flush()
    span.end()
    # Three events fit: the oldest (the app's) is dropped and counted, as add_event does.
    assert [e.name for e in span.events] == [attr.STAGE_EVENT] * 3
    assert span.dropped_events == 1


def test_stage_events_are_not_added_to_an_ended_span(sink: SpanSink) -> None:
    span = sink.provider.get_tracer("t").start_span("request")
    recorder = StageRecorder(span)
    recorder.record(StageId.ROUTER, 0.1)
    span.end()
    recorder.flush()
    (finished,) = sink.spans()
    assert list(finished.events) == []


def test_recorder_on_a_non_sdk_span_uses_public_add_event() -> None:
    class Recording(NonRecordingSpan):
        def __init__(self) -> None:
            super().__init__(SpanContext(1, 2, False))
            self.events: list[tuple[str, Any]] = []

        def add_event(self, name: str, attributes: Any = None, timestamp: Any = None) -> None:
            self.events.append((name, attributes))

    span = Recording()
    recorder = StageRecorder(span)
    recorder.record(StageId.HBM_LOAD, 1.5, phase=Phase.DECODE)
    recorder.flush()
    assert span.events == [(attr.STAGE_EVENT, {attr.STAGE: "hbm_load", attr.STAGE_SECONDS: 1.5,
                                               attr.PHASE: "decode"})]


def test_flush_onto_a_broken_span_is_counted_not_raised() -> None:
    class Broken(NonRecordingSpan):
        def add_event(self, name: str, attributes: Any = None, timestamp: Any = None) -> None:
            raise RuntimeError("boom")

    before = telemetry_errors.by_place().get("stage_recorder.flush", 0)
    recorder = StageRecorder(Broken(SpanContext(1, 2, False)))
    recorder.record(StageId.ROUTER, 0.1)
    recorder.flush()
    assert telemetry_errors.by_place()["stage_recorder.flush"] == before + 1


def test_guarded_returns_default_and_counts() -> None:
    errors = TelemetryErrors()
    errors.count("x", ValueError("a"))
    assert errors.by_place() == {"x": 1}

    @guarded("test.guarded", -1)
    def explode() -> int:
        raise KeyError("nope")

    before = telemetry_errors.by_place().get("test.guarded", 0)
    assert explode() == -1
    assert telemetry_errors.by_place()["test.guarded"] == before + 1


# --- prefix fingerprints ---------------------------------------------------------------
def test_fingerprints_are_chained_per_full_block_and_share_a_common_prefix() -> None:
    config = FingerprintConfig(block_tokens=4)
    a = prefix_fingerprints(list(range(10)), config)
    b = prefix_fingerprints([*range(8), 99, 98, 97, 96], config)
    c = prefix_fingerprints([0, 1, 2, 77, *range(4, 12)], config)
    assert len(a) == 2  # the partial third block has no fingerprint
    assert b[:2] == a  # same first 8 tokens
    assert len(b) == 3
    assert c[0] != a[0] and c[1] != a[1]  # chained: a change in block 0 changes every later one
    assert all(len(f) == 16 and int(f, 16) >= 0 for f in a)


def test_fingerprints_depend_on_the_salt_and_are_capped() -> None:
    tokens = list(range(64))
    plain = prefix_fingerprints(tokens, FingerprintConfig(block_tokens=8))
    salted = prefix_fingerprints(tokens, FingerprintConfig(salt=b"secret", block_tokens=8))
    assert plain != salted
    capped = prefix_fingerprints(tokens, FingerprintConfig(block_tokens=8, max_fingerprints=3))
    assert capped == plain[:3]


def test_fingerprint_config_validation_names_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        FingerprintConfig(block_tokens=0).validate()
    assert info.value.key == "fingerprint_block_tokens"
    with pytest.raises(ConfigError) as info:
        FingerprintConfig(salt=b"").validate()
    assert info.value.key == "fingerprint_salt"


def test_fingerprint_salt_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENPATH_FINGERPRINT_SALT", "deployment-secret")
    assert FingerprintConfig.from_env().salt == b"deployment-secret"
