"""The collector's Prometheus sink: cost by context-length bucket, zero-cost stages exposed."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tokenpath import metric_names as M
from tokenpath.collector.prometheus_sink import PrometheusSink
from tokenpath.leaks import context_bucket_labels
from tokenpath.records import PhaseShare, RequestRecord, StageTiming
from tokenpath.stages import Phase, Provenance, StageId

MODEL = "sink-model"


def _samples(sink: PrometheusSink, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for family in text_string_to_metric_families(sink.render()):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def _record(trace: int, input_tokens: int, output_tokens: int, cost: float) -> RequestRecord:
    return RequestRecord(
        trace_id=f"{trace:032x}", model=MODEL, input_tokens=input_tokens,
        output_tokens=output_tokens, cost_dollars=cost,
        stages={StageId.ROUTER: StageTiming(StageId.ROUTER, 0.001, Provenance.MEASURED, cost),
                StageId.SCHEDULER_QUEUE: StageTiming(StageId.SCHEDULER_QUEUE, 0.01,
                                                     Provenance.MEASURED, 0.0)})


def test_cost_is_exposed_by_context_length_bucket() -> None:
    sink = PrometheusSink()
    short, long_ = context_bucket_labels()[0], context_bucket_labels()[2]
    sink.consume_record(_record(1, 1000, 100, 0.25))  # 1,100 tokens of context
    sink.consume_record(_record(2, 900, 50, 0.5))
    sink.consume_record(_record(3, 10_000, 200, 2.0))  # 8,192 <= 10,200 < 32,768
    by_bucket = {dict(labels)[M.LABEL_CONTEXT_BUCKET]: value for labels, value
                 in _samples(sink, M.LONG_CONTEXT_COST.series).items()}
    assert by_bucket == {short: pytest.approx(0.75), long_: pytest.approx(2.0)}


def test_a_zero_cost_stage_still_has_its_cost_series() -> None:
    sink = PrometheusSink()
    sink.consume_record(_record(1, 100, 10, 0.1))
    by_stage = {dict(labels)[M.LABEL_STAGE]: value for labels, value
                in _samples(sink, M.COST.series).items()}
    assert by_stage == {StageId.ROUTER.value: pytest.approx(0.1),
                        StageId.SCHEDULER_QUEUE.value: 0.0}


def test_the_routers_predicted_cache_hit_is_counted_beside_the_engines() -> None:
    sink = PrometheusSink()
    scored = _record(1, 1000, 10, 0.1)
    scored.router_predicted_cache_hit, scored.cache_read_tokens = 0.8, 480
    unscored = _record(2, 500, 10, 0.1)  # no router score: not in the comparison
    unscored.cache_read_tokens = 500
    sink.consume_record(scored)
    sink.consume_record(unscored)
    by_kind = {dict(labels)[M.LABEL_KIND]: value for labels, value
               in _samples(sink, M.ROUTER_CACHE_PREDICTION.series).items()}
    assert by_kind == {M.ROUTER_KIND_INPUT: 1000, M.ROUTER_KIND_PREDICTED: pytest.approx(800),
                       M.ROUTER_KIND_ACTUAL: 480}


def test_miss_dollars_by_cause_on_the_dashboard_equal_the_reports() -> None:
    """The Cache and leaks board reads tokenpath_cache_miss_dollars_total{cause}; the report
    and /api/leaks sum the stored records: for the same records they agree."""
    from testkit.oracles.report import miss_causes

    records = []
    for i, (cold, routed, evicted) in enumerate(((0.5, 0.0, 0.0), (0.1, 0.3, 0.0),
                                                  (0.0, 0.2, 0.25))):
        record = _record(i + 1, 1000, 10, 1.0)
        record.miss_dollars = {"cold": cold, "routed_elsewhere": routed, "evicted": evicted}
        record.miss_tokens = {k: int(v * 1000) for k, v in record.miss_dollars.items()}
        records.append(record)
    sink = PrometheusSink()
    for record in records:
        sink.consume_record(record)
    on_board = {dict(labels)[M.LABEL_CAUSE]: value for labels, value
                in _samples(sink, M.CACHE_MISS_DOLLARS.series).items()}
    in_report = {cause: summary.dollars for cause, summary in miss_causes(records).items()
                 if summary.tokens}
    assert on_board == pytest.approx(in_report)


def test_energy_of_a_stage_without_phase_dollars_is_booked_under_none() -> None:
    """A measured kernel/HBM split spreads dollars over the stages, not their phases: its
    energy still reaches the metric (phase "none", as the cost metric books it)."""
    record = _record(1, 1000, 10, 0.01)
    record.stages = {StageId.KERNEL_EXEC: StageTiming(StageId.KERNEL_EXEC, 0.5,
                                                      Provenance.MEASURED, 0.01)}
    record.energy_joules = 700.0
    sink = PrometheusSink()
    sink.consume_record(record)
    energy = _samples(sink, M.ENERGY.series)
    assert sum(energy.values()) == pytest.approx(700.0)
    assert {dict(k)[M.LABEL_PHASE] for k in energy} == {M.PHASE_NONE}


def test_stage_series_are_kept_apart_by_model_and_phase_and_appear_when_first_written() -> None:
    """The sink keeps each (model, stage)'s series once looked up: records of two models,
    with and without phase splits, still land on their own series, and a phase's series
    appears only once a record has dollars there."""
    sink = PrometheusSink()
    prefill_only = StageTiming(StageId.KERNEL_EXEC, 0.2, Provenance.MODELED, 0.3,
                               {Phase.PREFILL: PhaseShare(0.2, 0.3)})
    first = RequestRecord(trace_id=f"{1:032x}", model="model-a",
                          stages={StageId.KERNEL_EXEC: prefill_only})
    sink.consume_record(first)
    assert {dict(k)[M.LABEL_PHASE] for k in _samples(sink, M.COST.series)} == {Phase.PREFILL.value}
    both = StageTiming(StageId.KERNEL_EXEC, 0.5, Provenance.MODELED, 1.5,
                       {Phase.PREFILL: PhaseShare(0.1, 0.25), Phase.DECODE: PhaseShare(0.4, 1.0)})
    sink.consume_record(RequestRecord(trace_id=f"{2:032x}", model="model-a",
                                      stages={StageId.KERNEL_EXEC: both}))  # 0.25 unsplit
    sink.consume_record(RequestRecord(trace_id=f"{3:032x}", model="model-b", stages={
        StageId.KERNEL_EXEC: StageTiming(StageId.KERNEL_EXEC, 0.1, Provenance.MODELED, 0.0),
    }))
    cost = {(dict(k)[M.LABEL_MODEL], dict(k)[M.LABEL_PHASE]): v
            for k, v in _samples(sink, M.COST.series).items()}
    assert cost == {("model-a", Phase.PREFILL.value): pytest.approx(0.55),
                    ("model-a", Phase.DECODE.value): pytest.approx(1.0),
                    ("model-a", M.PHASE_NONE): pytest.approx(0.25),
                    ("model-b", M.PHASE_NONE): 0.0}
    counts = {dict(k)[M.LABEL_MODEL]: v
              for k, v in _samples(sink, M.STAGE_DURATION.name + "_count").items()}
    assert counts == {"model-a": 2.0, "model-b": 1.0}


def test_slo_requests_and_dollars_by_class_and_outcome_and_the_classes_digest() -> None:
    from tokenpath.slo import SloClass, SloConfig

    classes = SloConfig((SloClass("interactive", ttft_seconds=0.5, objective=0.99,
                                  tenant="acme"),
                         SloClass("batch", e2e_seconds=60.0, objective=0.9)))
    sink = PrometheusSink(slo=classes)
    outcomes = [("interactive", "met", 1.0), ("interactive", "missed", 2.0),
                ("interactive", "met", 4.0), ("batch", "unknown", 8.0)]
    for i, (slo, outcome, cost) in enumerate(outcomes):
        record = _record(i, 10, 10, cost)
        record.slo, record.slo_outcome = slo, outcome
        sink.consume_record(record)
    sink.consume_record(_record(99, 10, 10, 16.0))  # no class: not an SLO sample
    requests = _samples(sink, M.SLO_REQUESTS.series)
    dollars = _samples(sink, M.SLO_DOLLARS.series)

    def key(slo: str, outcome: str) -> tuple[tuple[str, str], ...]:
        return (("model", MODEL), ("outcome", outcome), ("slo", slo))

    # every outcome of a class has its series from the class's first record: a class
    # with no miss yet reads a miss rate of 0, not no data
    assert requests == {key("interactive", "met"): 2, key("interactive", "missed"): 1,
                        key("interactive", "unknown"): 0, key("batch", "met"): 0,
                        key("batch", "missed"): 0, key("batch", "unknown"): 1}
    assert dollars == {key("interactive", "met"): 5.0, key("interactive", "missed"): 2.0,
                       key("interactive", "unknown"): 0.0, key("batch", "met"): 0.0,
                       key("batch", "missed"): 0.0, key("batch", "unknown"): 8.0}
    assert _samples(sink, M.SLO_OBJECTIVE.name) == {
        (("slo", "interactive"),): 0.99, (("slo", "batch"),): 0.9}
    assert _samples(sink, M.SLO_CONFIG_INFO.name) == {(("digest", classes.digest()),): 1.0}
    assert not _samples(PrometheusSink(), M.SLO_CONFIG_INFO.name)  # none configured
