"""Chargeback: who spent the window's dollars.

Each record's attributed dollars (its share of the GPU time it shared, plus its CPU and
network stages) go to its tenant (``tokenpath.tenant``; ``unattributed`` when none). The
window's idle dollars (GPU time no request used) follow a policy:

- ``proportional`` (default): to each tenant in proportion to its attributed dollars
  (``idle_t = idle x cost_t / sum(cost)``; all to ``unattributed`` when nothing was
  attributed);
- ``platform``: kept as one ``platform`` row, the platform team's own line.

Rows sum to the window's attributed plus idle dollars (the last row takes the rounding
remainder, so the sum is exact to the float). GPU energy goes the same way: each record's
joules to its tenant, the idle joules by the same policy and the same shares (by attributed
dollars), so the rows' joules sum to the window's request plus idle joules.

Here: the rows' shape and the idle allocation. The rows themselves are summed over a
window by the store (tokenpath/views.py chargeback_view); the same from a list of records,
which the tests check the view against, is testkit/oracles/chargeback.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from tokenpath.metric_names import TENANT_UNATTRIBUTED

PLATFORM_ROW = "platform"


class IdlePolicy(StrEnum):
    PROPORTIONAL = "proportional"
    PLATFORM = "platform"


@dataclass(slots=True)
class ChargebackRow:
    tenant: str
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_dollars: float = 0.0
    idle_dollars: float = 0.0
    energy_joules: float = 0.0
    idle_energy_joules: float = 0.0
    energy_provenance: str | None = None  # measured only when every record's joules were
    # SLO classes (tokenpath/slo.py): requests with a class, those that met their targets,
    # and the attributed dollars of those that missed.
    slo_requests: int = 0
    good_requests: int = 0
    missed_slo_dollars: float = 0.0

    @property
    def total_dollars(self) -> float:
        return self.cost_dollars + self.idle_dollars

    @property
    def dollars_per_good_request(self) -> float | None:
        """Attributed dollars over the requests that met their SLO (as the classes'
        figure); None with no good request."""
        return self.cost_dollars / self.good_requests if self.good_requests else None

    def to_json(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "requests": self.requests,
                "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "cost_dollars": self.cost_dollars, "idle_dollars": self.idle_dollars,
                "total_dollars": self.total_dollars, "energy_joules": self.energy_joules,
                "idle_energy_joules": self.idle_energy_joules,
                "energy_provenance": self.energy_provenance,
                "slo_requests": self.slo_requests, "good_requests": self.good_requests,
                "missed_slo_dollars": self.missed_slo_dollars,
                "dollars_per_good_request": self.dollars_per_good_request}


def allocate_idle(rows: list[ChargebackRow], idle_dollars: float,
                  policy: IdlePolicy = IdlePolicy.PROPORTIONAL,
                  idle_energy_joules: float = 0.0) -> list[ChargebackRow]:
    """The rows (their attributed figures summed), costliest first, with the idle dollars
    and joules allocated by ``policy``."""
    by_name = {row.tenant: row for row in rows}
    idle = max(0.0, idle_dollars)
    idle_joules = max(0.0, idle_energy_joules)
    ordered = sorted(rows, key=lambda r: (-r.cost_dollars, r.tenant))
    if policy is IdlePolicy.PLATFORM:
        if idle > 0 or idle_joules > 0 or not ordered:
            ordered.append(ChargebackRow(PLATFORM_ROW, idle_dollars=idle,
                                         idle_energy_joules=idle_joules))
        return ordered
    attributed = sum(r.cost_dollars for r in ordered)
    if attributed <= 0:
        if idle > 0 or idle_joules > 0:
            row = by_name.get(TENANT_UNATTRIBUTED)
            if row is None:
                row = ChargebackRow(TENANT_UNATTRIBUTED)
                ordered.append(row)
            row.idle_dollars, row.idle_energy_joules = idle, idle_joules
        return ordered
    given = given_joules = 0.0
    for index, row in enumerate(ordered):
        if index == len(ordered) - 1:  # the remainder: rows sum to the window exactly
            row.idle_dollars = idle - given
            row.idle_energy_joules = idle_joules - given_joules
        else:
            share = row.cost_dollars / attributed
            row.idle_dollars = idle * share
            row.idle_energy_joules = idle_joules * share
            given += row.idle_dollars
            given_joules += row.idle_energy_joules
    return ordered
