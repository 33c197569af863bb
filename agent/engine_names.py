"""How vLLM and SGLang /metrics names map onto tokenpath's engine metrics.

Keys are the exposed sample name with any ``_total`` suffix removed, so a counter matches
whether or not its exposition carries the suffix. ``aggregate`` says how several source
series for the same (engine, model) combine: counters and request counts add up, ratios
average. The model comes from the first of :data:`MODEL_LABELS` present on the sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from tokenpath import metric_names as mn
from tokenpath.metric_names import MetricSpec

ENGINE_VLLM: Final = "vllm"
ENGINE_SGLANG: Final = "sglang"
MODEL_LABELS: Final = (mn.VLLM_LABEL_MODEL_NAME, "model", "name")
UNKNOWN_MODEL: Final = "unknown"

Aggregate = Literal["sum", "mean"]


@dataclass(frozen=True, slots=True)
class EngineMetricRule:
    """One engine metric (``source`` without ``_total``) and the tokenpath metric it feeds."""

    source: str
    engine: str
    target: MetricSpec
    aggregate: Aggregate
    note: str = ""
    # An older name is ignored on a page that also has its successor (no double count
    # during a deprecation window).
    superseded_by: str | None = None


def _rule(
    source: str, target: MetricSpec, aggregate: Aggregate, note: str = "",
    superseded_by: str | None = None,
) -> EngineMetricRule:
    engine = source.split(":", 1)[0]
    return EngineMetricRule(source, engine, target, aggregate, note, superseded_by)


ENGINE_METRIC_RULES: tuple[EngineMetricRule, ...] = (
    # vLLM (V1 engine, 0.10+ through 0.32): prefix cache counters are in tokens.
    _rule(mn.VLLM_PREFIX_CACHE_HITS, mn.ENGINE_PREFIX_HIT_TOKENS, "sum"),
    _rule(mn.VLLM_PREFIX_CACHE_QUERIES, mn.ENGINE_PREFIX_QUERY_TOKENS, "sum"),
    _rule("vllm:gpu_prefix_cache_hits", mn.ENGINE_PREFIX_HIT_TOKENS, "sum",
          "older V1 spelling", superseded_by=mn.VLLM_PREFIX_CACHE_HITS),
    _rule("vllm:gpu_prefix_cache_queries", mn.ENGINE_PREFIX_QUERY_TOKENS, "sum",
          "older V1 spelling", superseded_by=mn.VLLM_PREFIX_CACHE_QUERIES),
    _rule(mn.VLLM_NUM_REQUESTS_RUNNING, mn.ENGINE_REQUESTS_RUNNING, "sum"),
    _rule(mn.VLLM_NUM_REQUESTS_WAITING, mn.ENGINE_REQUESTS_WAITING, "sum"),
    _rule(mn.VLLM_KV_CACHE_USAGE, mn.ENGINE_KV_USAGE, "mean", "a 0-1 fraction"),
    _rule("vllm:gpu_cache_usage_perc", mn.ENGINE_KV_USAGE, "mean", "older spelling, 0-1",
          superseded_by=mn.VLLM_KV_CACHE_USAGE),
    _rule("vllm:spec_decode_num_draft_tokens", mn.ENGINE_SPEC_DRAFT, "sum"),
    _rule("vllm:spec_decode_num_accepted_tokens", mn.ENGINE_SPEC_ACCEPTED, "sum"),
    _rule("vllm:prompt_tokens_cached", mn.ENGINE_PROMPT_TOKENS_CACHED, "sum"),
    _rule("vllm:estimated_flops_per_gpu", mn.ENGINE_ESTIMATED_FLOPS, "sum"),
    _rule("vllm:estimated_read_bytes_per_gpu", mn.ENGINE_ESTIMATED_READ_BYTES, "sum"),
    # SGLang: every prompt token is looked up in the radix cache, so prompt tokens are
    # the query tokens and cached tokens (any cache_source) the hits.
    _rule("sglang:cached_tokens", mn.ENGINE_PREFIX_HIT_TOKENS, "sum",
          "summed over cache_source"),
    _rule("sglang:prompt_tokens", mn.ENGINE_PREFIX_QUERY_TOKENS, "sum"),
    _rule("sglang:num_running_reqs", mn.ENGINE_REQUESTS_RUNNING, "sum"),
    _rule("sglang:num_queue_reqs", mn.ENGINE_REQUESTS_WAITING, "sum"),
    _rule("sglang:token_usage", mn.ENGINE_KV_USAGE, "mean", "KV pool token usage, 0-1"),
    _rule("sglang:cache_hit_rate", mn.ENGINE_PREFIX_HIT_RATE, "mean"),
    _rule("sglang:spec_accept_length", mn.ENGINE_SPEC_ACCEPT_LENGTH, "mean"),
)

RULES_BY_SOURCE: Final[dict[str, EngineMetricRule]] = {
    rule.source: rule for rule in ENGINE_METRIC_RULES
}

# Exposed-line prefixes worth parsing: every other line of a /metrics page is skipped
# before the Prometheus parser sees it (histogram buckets dominate those pages).
SOURCE_LINE_PREFIXES: Final[tuple[str, ...]] = tuple(
    sorted({rule.source for rule in ENGINE_METRIC_RULES})
)
