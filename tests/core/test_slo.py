"""SLO classes (tokenpath/slo.py): the config and its errors, classification, outcomes,
dominant stages and the window's summary."""

from __future__ import annotations

from typing import Any

import pytest

from testkit.oracles.slo import summarize_records
from tokenpath.collector.config import CollectorConfig
from tokenpath.config import ConfigError
from tokenpath.records import RequestRecord, StageTiming
from tokenpath.slo import (
    DEFAULT_CLASS,
    OUTCOME_MET,
    OUTCOME_MISSED,
    OUTCOME_UNKNOWN,
    STAGE_DECODE,
    STAGE_NETWORK,
    STAGE_PREFILL,
    STAGE_QUEUE,
    SloClass,
    SloConfig,
    classify_record,
    scaled,
)
from tokenpath.stages import Provenance, StageId

CLASSES: list[dict[str, Any]] = [
    {"name": "interactive", "match": {"tenant": "acme"}, "ttft_seconds": 0.5,
     "tpot_seconds": 0.05, "objective": 0.99},
    {"name": "priority", "match": {"attribute": {"app.priority": "high"}},
     "e2e_seconds": 10, "objective": 0.999},
    {"name": "batch", "ttft_seconds": 5.0, "e2e_seconds": 60,
     "objective": 0.9},
]


def _no_attributes(key: str) -> str | None:
    return None


def _record(**kwargs: Any) -> RequestRecord:
    defaults: dict[str, Any] = {"trace_id": "ab" * 16, "model": "m", "start_unix": 100.0,
                                "end_unix": 101.0}
    return RequestRecord(**{**defaults, **kwargs})


def test_a_config_file_gives_its_classes_in_order() -> None:
    config = SloConfig.from_file(CLASSES)
    assert [c.name for c in config.classes] == ["interactive", "priority", "batch"]
    assert config.classes[0].tenant == "acme"
    assert config.classes[1].attributes == (("app.priority", "high"),)
    assert config.classes[2].matches_all
    # the collector reads them from its file's slo_classes
    collector = CollectorConfig.from_sources(file={"slo_classes": CLASSES})
    assert collector.slo == config


@pytest.mark.parametrize(("change", "key"), [
    ({"ttft_seconds": -0.5}, "slo_classes[0].ttft_seconds"),
    ({"tpot_seconds": 0}, "slo_classes[0].tpot_seconds"),
    ({"e2e_seconds": "fast"}, "slo_classes[0].e2e_seconds"),
    ({"objective": 1.0}, "slo_classes[0].objective"),
    ({"objective": 0}, "slo_classes[0].objective"),
    ({"objective": 1.5}, "slo_classes[0].objective"),
    ({"match": {"region": "eu"}}, "slo_classes[0].match.region"),
    ({"match": {"attribute": "app.priority"}}, "slo_classes[0].match.attribute"),
    ({"latency": 1}, "slo_classes[0].latency"),
    ({"name": ""}, "slo_classes[0].name"),
])
def test_a_bad_class_is_refused_naming_the_key(change: dict[str, Any], key: str) -> None:
    bad = [{**CLASSES[0], **change}, *CLASSES[1:]]
    with pytest.raises(ConfigError) as caught:
        CollectorConfig.from_sources(file={"slo_classes": bad})
    assert caught.value.key == key, caught.value


def test_classes_that_cannot_work_are_refused() -> None:
    with pytest.raises(ConfigError) as caught:  # nothing to check
        SloConfig.from_file([{"name": "x", "objective": 0.9}])
    assert caught.value.key == "slo_classes[0]"
    with pytest.raises(ConfigError) as caught:  # a catch-all hides what follows it
        SloConfig.from_file([CLASSES[2], CLASSES[0]])
    assert caught.value.key == "slo_classes[0].match"
    with pytest.raises(ConfigError) as caught:
        SloConfig.from_file([CLASSES[0], CLASSES[0]])
    assert caught.value.key == "slo_classes[1].name"
    with pytest.raises(ConfigError) as caught:
        SloConfig.from_file({"name": "x"})
    assert caught.value.key == "slo_classes"


def test_the_first_matching_class_wins_and_unmatched_requests_are_default() -> None:
    config = SloConfig.from_file(CLASSES)
    high = {"app.priority": "high"}.get
    assert config.classify("acme", "m", high).name == "interactive"
    assert config.classify("globex", "m", high).name == "priority"
    assert config.classify("globex", "m", _no_attributes).name == "batch"
    only_acme = SloConfig.from_file(CLASSES[:1])
    assert only_acme.classify("globex", "m", _no_attributes).name == DEFAULT_CLASS
    assert only_acme.names() == ("interactive", DEFAULT_CLASS)
    by_model = SloConfig((SloClass("big", ttft_seconds=1.0, model="llama-70b"),))
    assert by_model.classify(None, "llama-70b", _no_attributes).name == "big"
    assert by_model.classify(None, "llama-8b", _no_attributes).name == DEFAULT_CLASS


def test_outcomes_met_missed_and_unknown() -> None:
    cls = SloClass("c", ttft_seconds=0.5, tpot_seconds=0.05)
    assert cls.outcome(0.4, 0.04, 3.0) == OUTCOME_MET
    assert cls.outcome(0.5, 0.05, 3.0) == OUTCOME_MET  # at the target is within it
    assert cls.outcome(0.6, 0.04, 3.0) == OUTCOME_MISSED
    assert cls.outcome(0.4, 0.06, 3.0) == OUTCOME_MISSED
    assert cls.outcome(None, 0.04, 3.0) == OUTCOME_UNKNOWN  # no TTFT: cannot tell
    assert cls.outcome(None, 0.06, 3.0) == OUTCOME_MISSED  # a target present was missed
    assert SloClass(DEFAULT_CLASS).outcome(0.1, 0.01, 1.0) == OUTCOME_UNKNOWN  # no targets


def test_a_missed_request_names_the_stage_its_time_went_to() -> None:
    config = SloConfig((SloClass("c", ttft_seconds=0.5, e2e_seconds=5.0),))
    slow_prefill = _record(ttft_seconds=0.9, queue_seconds=0.1, prefill_seconds=0.7,
                           decode_seconds=2.0)
    classify_record(slow_prefill, config, _no_attributes)
    # TTFT was missed: decode, the largest, is no part of it
    assert (slow_prefill.slo, slow_prefill.slo_outcome, slow_prefill.slo_miss_stage) == (
        "c", OUTCOME_MISSED, STAGE_PREFILL)
    queued = _record(ttft_seconds=0.9, queue_seconds=0.8, prefill_seconds=0.05)
    classify_record(queued, config, _no_attributes)
    assert queued.slo_miss_stage == STAGE_QUEUE
    long_decode = _record(end_unix=107.0, ttft_seconds=0.2, prefill_seconds=0.1,
                          decode_seconds=6.0)
    classify_record(long_decode, config, _no_attributes)
    assert long_decode.slo_miss_stage == STAGE_DECODE
    network = _record(end_unix=107.0, ttft_seconds=0.2, decode_seconds=1.0, stages={
        StageId.RESPONSE_PATH: StageTiming(StageId.RESPONSE_PATH, 4.0, Provenance.MEASURED),
        StageId.NIC_TX: StageTiming(StageId.NIC_TX, 1.0, Provenance.DERIVED)})
    classify_record(network, config, _no_attributes)
    assert network.slo_miss_stage == STAGE_NETWORK
    fine = _record(ttft_seconds=0.2)
    classify_record(fine, config, _no_attributes)
    assert (fine.slo_outcome, fine.slo_miss_stage) == (OUTCOME_MET, None)


def test_the_digest_names_the_classes_as_configured() -> None:
    config = SloConfig.from_file(CLASSES)
    assert config.digest() == SloConfig.from_file(CLASSES).digest()
    assert len(config.digest()) == 16
    assert config.digest() != SloConfig.from_file([*CLASSES[:2],
                                                   {**CLASSES[2], "objective": 0.95}]).digest()
    assert config.digest() != SloConfig.from_file([CLASSES[1], CLASSES[0],
                                                   CLASSES[2]]).digest()


def test_scaled_targets_follow_a_scaled_clock() -> None:
    config = scaled(SloConfig.from_file(CLASSES), 0.02)
    assert config.classes[0].ttft_seconds == pytest.approx(0.01)
    assert config.classes[2].e2e_seconds == pytest.approx(1.2)
    assert config.classes[0].objective == 0.99


def test_the_summary_gives_goodput_and_dollars_per_good_request() -> None:
    def rec(i: int, slo: str, outcome: str, cost: float, stage: str | None = None,
            engine: str = "e0") -> RequestRecord:
        return _record(trace_id=f"{i:032x}", start_unix=100.0 + i, end_unix=101.0 + i,
                       slo=slo, slo_outcome=outcome, slo_miss_stage=stage, cost_dollars=cost,
                       node="n0", engine_id=engine, tensor_parallel=4)

    records = [rec(0, "a", OUTCOME_MET, 1.0), rec(1, "a", OUTCOME_MET, 2.0),
               rec(2, "a", OUTCOME_MISSED, 4.0, STAGE_QUEUE),
               rec(3, "b", OUTCOME_UNKNOWN, 8.0, engine="e1"),
               rec(4, "b", OUTCOME_MET, 16.0, engine="e1"),
               _record(trace_id="f" * 32, cost_dollars=32.0, node="n0", engine_id="e0",
                       tensor_parallel=4)]  # no class: left out, its GPUs counted
    summary = summarize_records(records, 10.0)
    assert summary is not None
    assert summary.gpus == 8  # two engines of four GPUs
    a, b = summary.classes
    assert (a.slo, a.met, a.missed_dollars, a.attainment) == ("a", 2, 4.0, 2 / 3)
    assert a.dollars_per_good_request == pytest.approx(7.0 / 2)
    assert a.missed_by_stage == {STAGE_QUEUE: 1}
    assert b.attainment == 1.0  # unknown is neither met nor missed
    assert b.dollars_per_good_request == pytest.approx(24.0)
    data = summary.to_json()
    assert data["goodput_requests_per_second"] == pytest.approx(3 / 10)
    assert data["goodput_per_gpu"] == pytest.approx(3 / 10 / 8)
    assert data["met"] + data["missed"] + data["unknown"] == 5
    assert data["cost_dollars"] == pytest.approx(31.0)
    assert data["classes"][0]["goodput_requests_per_second"] == pytest.approx(0.2)
    assert summarize_records(records[-1:], 10.0) is None
