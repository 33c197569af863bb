"""Chargeback rows: per tenant, idle allocated by policy, summing to the window exactly;
the per-tenant metric sums to the per-model one."""

from __future__ import annotations

import pytest

from testkit.fakes.spans import new_trace_id
from testkit.oracles.chargeback import chargeback
from tokenpath import metric_names as M
from tokenpath.collector.cost.chargeback import PLATFORM_ROW, IdlePolicy
from tokenpath.collector.prometheus_sink import PrometheusSink
from tokenpath.records import RequestRecord, StageTiming
from tokenpath.stages import Provenance, StageId


def _record(tenant: str | None, dollars: float, model: str = "m") -> RequestRecord:
    record = RequestRecord(trace_id=new_trace_id(), tenant=tenant, model=model,
                           input_tokens=100, output_tokens=10, cost_dollars=dollars)
    record.stages[StageId.HBM_LOAD] = StageTiming(StageId.HBM_LOAD, 1.0, Provenance.MODELED,
                                                  dollars)
    return record


RECORDS = [_record("acme", 0.1 * (i % 7 + 1)) for i in range(40)] + [
    _record("globex", 0.03 * (i % 5 + 1), model="n") for i in range(25)] + [
    _record(None, 0.2)]
IDLE = 1.2345678


@pytest.mark.parametrize("policy", list(IdlePolicy))
def test_rows_sum_to_the_windows_attributed_plus_idle_dollars(policy: IdlePolicy) -> None:
    rows = chargeback(RECORDS, IDLE, policy)
    attributed = sum(r.cost_dollars for r in RECORDS)
    assert sum(r.total_dollars for r in rows) == pytest.approx(attributed + IDLE, abs=1e-9)
    assert sum(r.requests for r in rows) == len(RECORDS)
    assert {r.tenant for r in rows} >= {"acme", "globex", M.TENANT_UNATTRIBUTED}
    if policy is IdlePolicy.PLATFORM:
        assert rows[-1].tenant == PLATFORM_ROW and rows[-1].idle_dollars == IDLE
        assert all(r.idle_dollars == 0 for r in rows[:-1])
    else:  # idle in proportion to attributed dollars
        acme = next(r for r in rows if r.tenant == "acme")
        assert acme.idle_dollars == pytest.approx(IDLE * acme.cost_dollars / attributed)


def test_idle_with_nothing_attributed_goes_to_unattributed() -> None:
    rows = chargeback([], 2.0)
    assert [(r.tenant, r.idle_dollars) for r in rows] == [(M.TENANT_UNATTRIBUTED, 2.0)]


def test_the_per_tenant_metric_sums_to_the_per_model_one() -> None:
    sink = PrometheusSink()
    for record in RECORDS:
        sink.consume_record(record)
    per_tenant: dict[str, float] = {}
    per_model: dict[str, float] = {}
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(sink.render()):
        for sample in family.samples:
            if sample.name == M.TENANT_COST.series:
                model = sample.labels[M.LABEL_MODEL]
                per_tenant[model] = per_tenant.get(model, 0.0) + sample.value
            elif sample.name == M.COST.series:
                model = sample.labels[M.LABEL_MODEL]
                per_model[model] = per_model.get(model, 0.0) + sample.value
    assert per_tenant == pytest.approx(per_model)
    assert set(per_model) == {"m", "n"}


def test_zero_cost_rows_and_no_idle_do_not_divide_by_zero() -> None:
    rows = chargeback([_record("a", 0.0), _record("b", 0.0)], 0.0)
    assert sum(r.total_dollars for r in rows) == 0.0 and len(rows) == 2


@pytest.mark.parametrize("policy", list(IdlePolicy))
def test_rows_carry_the_windows_request_and_idle_joules(policy: IdlePolicy) -> None:
    for i, record in enumerate(RECORDS):
        record.energy_joules = 50.0 + i
    idle_joules = 987.654
    rows = chargeback(RECORDS, IDLE, policy, idle_energy_joules=idle_joules)
    total = sum(r.energy_joules + r.idle_energy_joules for r in rows)
    assert total == pytest.approx(sum(r.energy_joules for r in RECORDS) + idle_joules,
                                  rel=1e-12)
    acme = next(r for r in rows if r.tenant == "acme")
    assert acme.energy_provenance is None  # no record said how its joules were had
    if policy is IdlePolicy.PLATFORM:
        assert rows[-1].idle_energy_joules == idle_joules and acme.idle_energy_joules == 0
    else:  # the same shares as the idle dollars
        assert acme.idle_energy_joules / idle_joules == pytest.approx(acme.idle_dollars / IDLE)


def test_a_row_is_measured_only_when_every_record_of_it_was() -> None:
    records = [_record("a", 1.0), _record("a", 1.0), _record("b", 1.0)]
    records[0].energy_provenance = records[2].energy_provenance = "measured"
    records[1].energy_provenance = "modeled"
    rows = {r.tenant: r for r in chargeback(records, 0.0)}
    assert (rows["a"].energy_provenance, rows["b"].energy_provenance) == ("modeled", "measured")
