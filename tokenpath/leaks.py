"""The money leaks' vocabulary: one source for the CLI, the API, the UI and the metrics.

Leak 1 is prefill re-run for a prefix the cache could have served. Each recomputed
fingerprinted block of a prompt has one cause, and each cause its own fix
(collector/cost/cache.py has the rules; docs/cost-model.md their limits).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class MissCause(StrEnum):
    """Why a fingerprinted prefix block was computed instead of read from the cache."""

    COLD = "cold"  # never seen before: its first prefill (not waste)
    ROUTED_ELSEWHERE = "routed_elsewhere"  # cached on another engine only
    EVICTED = "evicted"  # seen on this same engine, gone from its cache
    SUB_BLOCK = "sub_block"  # seen, but within one block of what the cache served


# Causes whose dollars are waste: the prefix was seen recently but recomputed.
WASTE_CAUSES: Final = (MissCause.ROUTED_ELSEWHERE, MissCause.EVICTED, MissCause.SUB_BLOCK)

MISS_CAUSE_FIXES: Final[dict[MissCause, str]] = {
    MissCause.COLD: "none needed: a prefix's first prefill (pre-warm only if it repeats)",
    MissCause.ROUTED_ELSEWHERE: "a prefix-affine router (llm-d precise prefix-cache scorer, "
                                "Dynamo KV router): `tokenpath whatif --router prefix-affine`",
    MissCause.EVICTED: "more KV memory per engine or a host/CPU KV tier (LMCache, HiCache)",
    MissCause.SUB_BLOCK: "a smaller KV block size, or prompts whose shared part ends on a "
                         "block boundary",
}
