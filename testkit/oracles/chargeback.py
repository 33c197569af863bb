"""Chargeback from a list of records (views.chargeback_view's oracle): one row per tenant
(or model, or pool), summed record by record, idle allocated by the package's own
``allocate_idle``."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from tokenpath.collector.cost.chargeback import ChargebackRow, IdlePolicy, allocate_idle
from tokenpath.metric_names import TENANT_UNATTRIBUTED
from tokenpath.records import RequestRecord
from tokenpath.report import combined_energy_provenance
from tokenpath.slo import OUTCOME_MET, OUTCOME_MISSED


def tenant_of(record: RequestRecord) -> str | None:
    return record.tenant


def chargeback(records: Iterable[RequestRecord], idle_dollars: float,
               policy: IdlePolicy = IdlePolicy.PROPORTIONAL,
               key: Callable[[RequestRecord], str | None] = tenant_of,
               idle_energy_joules: float = 0.0) -> list[ChargebackRow]:
    """One row per tenant (or per ``key``: model, pool; ``unattributed`` when it has none)
    and a platform row under ``platform``, costliest first."""
    rows: dict[str, ChargebackRow] = {}
    kinds: dict[str, set[str | None]] = {}
    for record in records:
        tenant = key(record) or TENANT_UNATTRIBUTED
        row = rows.get(tenant)
        if row is None:
            row = rows[tenant] = ChargebackRow(tenant)
        row.requests += 1
        row.input_tokens += max(0, record.input_tokens)
        row.output_tokens += max(0, record.output_tokens)
        row.cost_dollars += record.cost_dollars
        row.energy_joules += max(0.0, record.energy_joules)
        if record.slo_outcome is not None:
            row.slo_requests += 1
            if record.slo_outcome == OUTCOME_MET:
                row.good_requests += 1
            elif record.slo_outcome == OUTCOME_MISSED:
                row.missed_slo_dollars += record.cost_dollars
        kinds.setdefault(tenant, set()).add(record.energy_provenance)
    for tenant, row in rows.items():
        row.energy_provenance = combined_energy_provenance(kinds[tenant])
    return allocate_idle(list(rows.values()), idle_dollars, policy, idle_energy_joules)
