"""The money leaks' vocabulary: one source for the CLI, the API, the UI and the metrics.

Leak 1 is prefill re-run for a prefix the cache could have served. Each recomputed
fingerprinted block of a prompt has one cause, and each cause its own fix
(collector/cost/cache.py has the rules; docs/cost-model.md their limits).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Final, Protocol


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


# --- leak 2: one context-length bucket table for the CLI, API, UI, metrics and what-if --
# A request's context is its input plus output tokens: the span attention covers by its
# last token. Bucket edges in tokens; a request is long-context from LONG_CONTEXT_TOKENS.
CONTEXT_BUCKET_BOUNDS: Final[tuple[int, ...]] = (2_048, 8_192, 32_768, 131_072)
LONG_CONTEXT_TOKENS: Final = 8_192


class HasTokens(Protocol):
    @property
    def input_tokens(self) -> int: ...

    @property
    def output_tokens(self) -> int: ...


def context_tokens(record: HasTokens) -> int:
    return max(0, record.input_tokens) + max(0, record.output_tokens)


def context_bucket_labels(bounds: Sequence[int] = CONTEXT_BUCKET_BOUNDS) -> list[str]:
    """The bucket labels in order: ``0-2048``, ..., ``>=131072``."""
    labels: list[str] = []
    lower = 0
    for bound in bounds:
        labels.append(f"{lower}-{bound}")
        lower = bound
    labels.append(f">={lower}")
    return labels


def context_bucket_edges(bounds: Sequence[int] = CONTEXT_BUCKET_BOUNDS
                         ) -> list[tuple[int, int | None]]:
    """(lowest, highest or None) tokens of each bucket, in order."""
    lows = (0, *bounds)
    return [(low, bounds[i] if i < len(bounds) else None) for i, low in enumerate(lows)]


def context_bucket_index(tokens: int, bounds: Sequence[int] = CONTEXT_BUCKET_BOUNDS) -> int:
    """Index of the bucket holding a context of ``tokens``."""
    return next((i for i, bound in enumerate(bounds) if tokens < bound), len(bounds))

