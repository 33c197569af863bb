"""How vLLM and SGLang /metrics names map onto tokenpath's engine metrics.

Keys are the exposed sample name with any ``_total`` suffix removed, so a counter matches
whether or not its exposition carries the suffix. ``aggregate`` says how several source
series for the same (engine, model) combine: counters and request counts add up, ratios
average. The model comes from the first of :data:`MODEL_LABELS` present on the sample.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from tokenpath import metric_names as mn
from tokenpath.metric_names import UNKNOWN, MetricSpec

ENGINE_VLLM: Final = "vllm"
ENGINE_SGLANG: Final = "sglang"
MODEL_LABELS: Final = (mn.VLLM_LABEL_MODEL_NAME, "model", "name")
UNKNOWN_MODEL: Final = UNKNOWN

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
    # A third label the target keeps: the engine's label of that name, its values mapped
    # through ``values`` (a value not in it is skipped: the label stays bounded).
    label: str | None = None
    values: Mapping[str, str] | None = None


def _rule(
    source: str, target: MetricSpec, aggregate: Aggregate, note: str = "",
    superseded_by: str | None = None, label: str | None = None,
    values: Mapping[str, str] | None = None,
) -> EngineMetricRule:
    engine = source.split(":", 1)[0]
    return EngineMetricRule(source, engine, target, aggregate, note, superseded_by, label,
                            values)


# vLLM PromptTokenStats.ALL_SOURCES (vllm:prompt_tokens_by_source, label "source") and
# SGLang's realtime_tokens modes, as tokenpath's token sources.
VLLM_TOKEN_SOURCES: Final = {"local_compute": mn.TOKEN_SOURCE_COMPUTE,
                             "local_cache_hit": mn.TOKEN_SOURCE_LOCAL_CACHE,
                             "external_kv_transfer": mn.TOKEN_SOURCE_KV_TRANSFER}
SGLANG_TOKEN_MODES: Final = {"prefill_compute": mn.TOKEN_SOURCE_COMPUTE,
                             "prefill_cache": mn.TOKEN_SOURCE_LOCAL_CACHE}
# SGLang's RequestStage values recorded in per_stage_req_latency_seconds (req_time_stats.py)
SGLANG_STAGES: Final = {name: name for name in (
    "request_process", "prefill_forward", "chunked_prefill", "prefill_bootstrap",
    "prefill_transfer_kv_cache", "decode_prepare", "decode_bootstrap", "decode_waiting",
    "decode_transferred", "fake_output", "quick_finish")}


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
    # 2026: where prompt tokens' KV came from (vLLM PR #33290; SGLang realtime_tokens)
    _rule("vllm:prompt_tokens_by_source", mn.ENGINE_PROMPT_TOKENS_BY_SOURCE, "sum",
          label="source", values=VLLM_TOKEN_SOURCES),
    _rule("sglang:realtime_tokens", mn.ENGINE_PROMPT_TOKENS_BY_SOURCE, "sum",
          label="mode", values=SGLANG_TOKEN_MODES),
    # vLLM NIXL KV connector (kv_connector/v1/nixl/stats.py): histograms' sums and counts
    _rule("vllm:nixl_xfer_time_seconds_sum", mn.ENGINE_KV_TRANSFER_SECONDS, "sum"),
    _rule("vllm:nixl_xfer_time_seconds_count", mn.ENGINE_KV_TRANSFERS, "sum"),
    _rule("vllm:nixl_bytes_transferred_sum", mn.ENGINE_KV_TRANSFER_BYTES, "sum"),
    _rule("vllm:nixl_num_failed_transfers", mn.ENGINE_KV_TRANSFER_FAILURES, "sum"),
    _rule("sglang:num_transfer_failed_reqs", mn.ENGINE_KV_TRANSFER_FAILURES, "sum"),
    # vLLM KV block residency (--kv-cache-metrics; sampled)
    _rule("vllm:kv_block_lifetime_seconds_count", mn.ENGINE_KV_BLOCK_EVICTIONS, "sum"),
    _rule("vllm:kv_block_lifetime_seconds_sum", mn.ENGINE_KV_BLOCK_LIFETIME_SECONDS, "sum"),
    _rule("vllm:kv_block_idle_before_evict_seconds_sum", mn.ENGINE_KV_BLOCK_IDLE_SECONDS,
          "sum"),
    # SGLang per-stage latency (observability/metrics_collector.py), by its stage names
    _rule("sglang:per_stage_req_latency_seconds_sum", mn.ENGINE_STAGE_SECONDS, "sum",
          label="stage", values=SGLANG_STAGES),
    _rule("sglang:per_stage_req_latency_seconds_count", mn.ENGINE_STAGE_REQUESTS, "sum",
          label="stage", values=SGLANG_STAGES),
)

RULES_BY_SOURCE: Final[dict[str, EngineMetricRule]] = {
    rule.source: rule for rule in ENGINE_METRIC_RULES
}

# Exposed-line prefixes worth parsing: every other line of a /metrics page is skipped
# before the Prometheus parser sees it (histogram buckets dominate those pages).
SOURCE_LINE_PREFIXES: Final[tuple[str, ...]] = tuple(
    sorted({rule.source for rule in ENGINE_METRIC_RULES})
)
