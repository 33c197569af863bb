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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenpath.collector.cost.longcontext import last_doubling_prefill_dollars
from tokenpath.collector.cost.routing_whatif import prefix_affine_whatif
from tokenpath.last_mile import coalesced_packets, is_stream, packets_of
from tokenpath.leaks import LONG_CONTEXT_TOKENS, WASTE_CAUSES, MissCause, context_tokens
from tokenpath.records import RequestRecord
from tokenpath.report import miss_causes
from tokenpath.stages import StageId
from tokenpath.wire_sizes import PACKET_OVERHEAD_BYTES

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


def _cache_leak(records: Sequence[RequestRecord], replay_routing: bool) -> RankedLeak:
    causes = miss_causes(records)
    waste = {c: causes[c.value] for c in WASTE_CAUSES}
    top = max(waste.values(), key=lambda m: m.dollars)
    dollars = sum(m.dollars for m in waste.values())
    if top.cause is MissCause.ROUTED_ELSEWHERE and top.dollars > 0 and replay_routing:
        routed = prefix_affine_whatif(records)
        gain = routed.hit_ratio_gain or 0.0
        return RankedLeak("cache_misses", dollars, top.fix, max(0.0, routed.prefill_dollars_saved),
                          f"a prefix-affine router: hit ratio {gain * 100:+.1f} pp (replayed)")
    return RankedLeak("cache_misses", dollars, top.fix, top.dollars,
                      f"the {top.cause.value} misses' prefill (an upper bound)")


def _long_context_leak(records: Sequence[RequestRecord]) -> RankedLeak:
    long = [r for r in records if context_tokens(r) >= LONG_CONTEXT_TOKENS]
    return RankedLeak(
        "long_contexts", sum(r.cost_dollars for r in long),
        f"cap, summarise or retrieve contexts past {LONG_CONTEXT_TOKENS:,} tokens; cache the "
        "shared part", last_doubling_prefill_dollars(long),
        f"halving the {len(long)} long contexts (their last doubling's prefill)")


def _last_mile_leak(records: Sequence[RequestRecord], dollars_per_byte: float) -> RankedLeak:
    streams = [r for r in records if is_stream(r)]
    response = sum(r.stages[StageId.RESPONSE_PATH].cost_dollars for r in streams
                   if StageId.RESPONSE_PATH in r.stages)
    framing = sum(packets_of(r) for r in streams) * PACKET_OVERHEAD_BYTES * dollars_per_byte
    coalesced = sum(coalesced_packets(r, COALESCE_FIX_TOKENS) for r in streams) * (
        PACKET_OVERHEAD_BYTES * dollars_per_byte)
    return RankedLeak(
        "last_mile", response + framing,
        f"write {COALESCE_FIX_TOKENS} tokens per streamed chunk (or flush on a timer)",
        max(0.0, framing - coalesced),
        f"the framing of {COALESCE_FIX_TOKENS}-token writes instead of one per token")


def rank_leaks(records: Sequence[RequestRecord], network_dollars_per_byte: float,
               replay_routing: bool = True) -> list[RankedLeak]:
    """``replay_routing``: price the routing fix by the routing what-if's replay (the CLI
    and the demo; seconds on a large window), else by the routed misses' dollars (an upper
    bound: the API, which answers every UI refresh)."""
    leaks = [_cache_leak(records, replay_routing), _long_context_leak(records),
             _last_mile_leak(records, network_dollars_per_byte)]
    return sorted(leaks, key=lambda leak: -leak.dollars)
