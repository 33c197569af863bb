"""The three leaks ranked by dollars, each with its fix and what the fix would save.

- **Cache misses**: the waste causes' dollars. The fix is the costliest cause's; the
  saving is the routing what-if's prefill dollars when routing is the cause
  (collector/cost/routing_whatif.py; the API skips that replay and gives the upper bound),
  else that cause's dollars (what it cost is what a cache that kept the prefix would have
  saved: an upper bound).
- **Long contexts**: the dollars of requests past LONG_CONTEXT_TOKENS. The saving is what
  their last doubling of context cost in prefill (collector/cost/longcontext.py).
- **Last mile**: the response path's dollars plus the framing bytes' (segments x 90 B x
  $/byte). The saving is the framing coalescing 16 tokens per write would remove
  (tokenpath/last_mile.py).

Every saving is modeled; the dollars are the attributed ones.

Here: a ranked leak's shape. tokenpath/views.py ranks them over a store's window
(rank_leaks_view; leaks_view's ``ranked``); the same from a list of records, which the
tests check the views against, is testkit/oracles/leaks.py.
"""

from __future__ import annotations

from dataclasses import dataclass

COALESCE_FIX_TOKENS = 16


@dataclass(frozen=True, slots=True)
class RankedLeak:
    leak: str
    dollars: float
    fix: str
    saving_dollars: float
    saving: str

    def to_json(self) -> dict[str, object]:
        return {"leak": self.leak, "dollars": self.dollars, "fix": self.fix,
                "saving_dollars": self.saving_dollars, "saving": self.saving,
                "saving_provenance": "modeled"}
