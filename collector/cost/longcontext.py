"""Long context: where the spend goes by context length, the quadratic term explicit.

Prefill attention FLOPs grow with ``n * c + n (n + 1) / 2`` (new tokens ``n`` after ``c``
cached): quadratic in the prompt. For each context-length bucket this reports the requests,
their dollars, the share of all dollars and the share of their prefill FLOPs that is that
attention term (modeled, from the catalog roofline).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tokenpath.collector.cost.catalog import catalog_model_name
from tokenpath.leaks import (
    CONTEXT_BUCKET_BOUNDS,
    context_bucket_index,
    context_bucket_labels,
    context_tokens,
)
from tokenpath.records import RequestRecord
from tokenpath.roofline import GPUS, MODELS, Roofline

DEFAULT_BUCKET_BOUNDS: tuple[int, ...] = CONTEXT_BUCKET_BOUNDS
ROOFLINE_GPU = "H100-SXM"  # FLOP shares do not depend on the GPU


@dataclass(slots=True)
class ContextBucketSpend:
    bucket: str
    requests: int = 0
    cost_dollars: float = 0.0
    share_of_spend: float = 0.0
    prefill_flops: float = 0.0
    attention_flops: float = 0.0

    @property
    def attention_share(self) -> float:
        """Share of the bucket's prefill FLOPs that is the quadratic attention term."""
        return self.attention_flops / self.prefill_flops if self.prefill_flops > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["attention_share"] = self.attention_share
        return out


def spend_by_context_bucket(
    records: Iterable[RequestRecord],
    bounds: Sequence[int] = DEFAULT_BUCKET_BOUNDS,
) -> list[ContextBucketSpend]:
    """Spend per context-length bucket (context = input + output tokens)."""
    labels = context_bucket_labels(bounds)
    buckets = [ContextBucketSpend(label) for label in labels]
    total = 0.0
    for record in records:
        context = context_tokens(record)
        bucket = buckets[context_bucket_index(context, bounds)]
        bucket.requests += 1
        bucket.cost_dollars += record.cost_dollars
        total += record.cost_dollars
        model = catalog_model_name(record.model)
        if model is None:
            continue
        roofline = Roofline(GPUS[ROOFLINE_GPU], MODELS[model])
        cached = max(0, min(record.cache_read_tokens, record.input_tokens - 1))
        new = max(1, record.input_tokens - cached)
        bucket.prefill_flops += roofline.prefill_flops(new, cached)
        bucket.attention_flops += roofline.prefill_attention_flops(new, cached)
    for bucket in buckets:
        bucket.share_of_spend = bucket.cost_dollars / total if total > 0 else 0.0
    return buckets
