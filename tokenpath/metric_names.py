"""Prometheus metric names and label names: the one place they are spelled.

docs/reference.md. The collector and agent register metrics with these names, the
dashboards and rules generators build queries from them, and tests look them up here.
Names are given without the ``_total`` suffix for counters where prometheus-client adds
it; ``*_SERIES`` constants give the exposed series name for queries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

MetricType = Literal["counter", "gauge", "histogram"]
NAMESPACE: Final = "tokenpath"

# --- Label names and values
LABEL_MODEL: Final = "model"
LABEL_STATUS: Final = "status"
LABEL_STAGE: Final = "stage"
LABEL_PHASE: Final = "phase"
LABEL_KIND: Final = "kind"
LABEL_POOL: Final = "pool"
LABEL_SOURCE: Final = "source"
LABEL_DEVICE: Final = "device"
LABEL_GPU: Final = "gpu"
LABEL_ENGINE: Final = "engine"
LABEL_REASON: Final = "reason"
LABEL_PROVENANCE: Final = "provenance"
LABEL_NODE: Final = "node"
LABEL_RECEIVER: Final = "receiver"
LABEL_OUTCOME: Final = "outcome"
# SLO classes (tokenpath/slo.py): the class, and the digest of the configured classes.
LABEL_SLO: Final = "slo"
LABEL_DIGEST: Final = "digest"
# Values of the ``kind`` label on the token counter.
TOKEN_KIND_INPUT: Final = "input"
TOKEN_KIND_CACHE_READ: Final = "cache_read"
TOKEN_KIND_OUTPUT: Final = "output"
# Value a bounded label takes past its allowed set or cardinality cap.
OTHER_LABEL_VALUE: Final = "other"
# What a record, label or pricing unit says when nothing names the thing (one spelling).
UNKNOWN: Final = "unknown"
LABEL_TENANT: Final = "tenant"
TENANT_UNATTRIBUTED: Final = "unattributed"
LABEL_CAUSE: Final = "cause"
ROUTER_KIND_INPUT: Final = "input"
ROUTER_KIND_PREDICTED: Final = "predicted"
ROUTER_KIND_ACTUAL: Final = "actual"
LABEL_TOKEN_SOURCE: Final = "token_source"
TOKEN_SOURCE_COMPUTE: Final = "compute"
TOKEN_SOURCE_LOCAL_CACHE: Final = "local_cache"
TOKEN_SOURCE_KV_TRANSFER: Final = "kv_transfer"
# ``phase`` label value for stages that are not split into prefill and decode.
PHASE_NONE: Final = "none"
# ``size`` label values of RESPONSE_CHUNKS.
CHUNK_SIZE_SMALL: Final = "small"
CHUNK_SIZE_NORMAL: Final = "normal"
LABEL_CONTEXT_BUCKET: Final = "context_bucket"
LABEL_SIZE: Final = "size"
# Scrape-target labels set by the Prometheus scrape config (deploy/), not by the exporters.
LABEL_JOB: Final = "job"
LABEL_INSTANCE: Final = "instance"
# The histogram bucket bound label and series suffixes Prometheus exposes.
LABEL_LE: Final = "le"

# --- Series names Prometheus exposes
HISTOGRAM_BUCKET_SUFFIX: Final = "_bucket"
HISTOGRAM_COUNT_SUFFIX: Final = "_count"
HISTOGRAM_SUM_SUFFIX: Final = "_sum"
# The suffix Prometheus exposes a counter's samples under.
COUNTER_SUFFIX: Final = "_total"
# Prometheus's own per-target health series.
UP_SERIES: Final = "up"

# --- The metric contract


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """A metric's contract: name as registered, type, labels and help text."""

    name: str
    type: MetricType
    labels: tuple[str, ...]
    help: str

    @property
    def series(self) -> str:
        """The sample name a query uses (counters get ``_total``)."""
        return self.name + COUNTER_SUFFIX if self.type == "counter" else self.name


def _m(name: str, type_: MetricType, labels: tuple[str, ...], help_: str) -> MetricSpec:
    return MetricSpec(f"{NAMESPACE}_{name}", type_, labels, help_)


# --- Collector: requests, cost, energy
REQUESTS = _m("requests", "counter", (LABEL_MODEL, LABEL_STATUS),
              "Requests recorded by the collector.")
STAGE_DURATION = _m("stage_duration_seconds", "histogram", (LABEL_STAGE, LABEL_MODEL),
                    "Time spent in each of the 15 stages per request.")
TTFT = _m("time_to_first_token_seconds", "histogram", (LABEL_MODEL,),
          "Time to first token per request.")
TPOT = _m("time_per_output_token_seconds", "histogram", (LABEL_MODEL,),
          "Mean time per output token after the first, per request.")
TOKENS = _m("tokens", "counter", (LABEL_MODEL, LABEL_KIND),
            "Tokens by kind: input, cache_read (input served from the prefix cache), output.")
COST = _m("cost_dollars", "counter", (LABEL_STAGE, LABEL_PHASE, LABEL_MODEL),
          "Dollars attributed to requests, by stage and phase.")
IDLE_COST = _m("idle_cost_dollars", "counter", (LABEL_POOL,),
               "Dollars of GPU time with no request active, by pool.")
IDLE_COST_RECLAIMED = _m("idle_cost_reclaimed_dollars", "counter", (LABEL_POOL,),
                         "Idle dollars charged afterwards to late records (the store's "
                         "negative idle rows), by pool: net idle is "
                         "tokenpath_idle_cost_dollars_total minus this.")
CACHE_MISS_WASTE = _m("cache_miss_waste_dollars", "counter", (LABEL_MODEL,),
                      "Prefill dollars spent on prefixes seen recently but recomputed.")
NAIVE_COST = _m("naive_cost_dollars", "counter", (LABEL_MODEL,),
                "Wall-clock cost (duration x GPU price), as gateway tools count it.")
ENERGY = _m("energy_joules", "counter", (LABEL_STAGE, LABEL_PHASE, LABEL_MODEL),
            "GPU energy attributed to requests, by GPU stage and phase: the node agent's "
            "measured GPU joules apportioned like dollars, modeled (GPU-seconds x TDP) where "
            "no agent reports them (collector/cost/energy.py; the measured part is "
            "tokenpath_energy_measured_joules_total).")
ENERGY_MEASURED = _m("energy_measured_joules", "counter", (LABEL_MODEL,),
                     "The part of tokenpath_energy_joules_total apportioned from measured "
                     "GPU energy (records whose every slice the agent's counters covered).")
IDLE_ENERGY = _m("idle_energy_joules", "counter", (LABEL_POOL,),
                 "GPU energy with no request active, by pool: measured where the node's "
                 "agent reports it, else modeled (idle GPU-seconds x TDP x 0.15).")
TENANT_COST = _m("tenant_cost_dollars", "counter", (LABEL_TENANT, LABEL_MODEL),
                 "Attributed dollars by tenant (tokenpath.tenant; unattributed when none) "
                 "and model; tenants past the label cap are 'other'.")
TENANT_REQUESTS = _m("tenant_requests", "counter", (LABEL_TENANT, LABEL_MODEL),
                     "Requests by tenant and model.")
CACHE_MISS_DOLLARS = _m(
    "cache_miss_dollars", "counter", (LABEL_MODEL, LABEL_CAUSE),
    "Prefill dollars of fingerprinted prefix blocks computed instead of read from the cache, "
    "by cause: cold, routed_elsewhere, evicted, sub_block (all but cold are waste).")
CACHE_MISS_TOKENS = _m(
    "cache_miss_tokens", "counter", (LABEL_MODEL, LABEL_CAUSE),
    "Prompt tokens of fingerprinted prefix blocks computed instead of read from the cache, "
    "by cause.")
ROUTER_CACHE_PREDICTION = _m(
    "router_cache_prediction_tokens", "counter", (LABEL_MODEL, LABEL_KIND),
    "Prompt tokens of the requests a router scored for prefix-cache hits (llm-d), by kind: "
    "input, predicted (the router's predicted hit x input), actual (the engine's cache reads).")
LONG_CONTEXT_COST = _m("context_cost_dollars", "counter", (LABEL_MODEL, "context_bucket"),
                       "Dollars by context-length bucket.")
RESPONSE_CHUNKS = _m("response_chunks", "counter", (LABEL_MODEL, "size"),
                     "Streamed response chunks by payload size class (small = under 64 B).")
SLO_REQUESTS = _m("slo_requests", "counter", (LABEL_SLO, LABEL_OUTCOME, LABEL_MODEL),
                  "Requests by SLO class and outcome: met, missed, or unknown (a measure its "
                  "class targets is absent); goodput is the rate of met.")
SLO_DOLLARS = _m("slo_dollars", "counter", (LABEL_SLO, LABEL_OUTCOME, LABEL_MODEL),
                 "Attributed dollars (the records' cost_dollars) by SLO class and outcome.")
SLO_OBJECTIVE = _m("slo_objective_ratio", "gauge", (LABEL_SLO,),
                   "Each configured SLO class's objective: the share of its requests that "
                   "must meet its targets (the burn-rate alerts' budget is 1 - this).")
SLO_CONFIG_INFO = _m("slo_config_info", "gauge", (LABEL_DIGEST,),
                     "1, labelled with a digest of the configured SLO classes: every "
                     "replica that maps traces must show the same one.")
LABEL_LINK: Final = "link"
LINK_NVLINK: Final = "nvlink"  # the KV cache moved inside a node
LINK_NETWORK: Final = "network"  # the KV cache moved across nodes (switch, NIC, Ethernet)
KV_TRANSFER_BYTES = _m("kv_transfer_bytes", "counter", (LABEL_MODEL, LABEL_LINK),
                       "KV cache bytes disaggregated requests moved from their prefill engine "
                       "to their decode engine (transferred tokens x the model's KV bytes "
                       "per token, modeled), by link: nvlink inside a node, network across.")
COLLECTOR_METRICS: tuple[MetricSpec, ...] = (
    REQUESTS, STAGE_DURATION, TTFT, TPOT, TOKENS, COST, IDLE_COST, IDLE_COST_RECLAIMED,
    CACHE_MISS_WASTE,
    NAIVE_COST, LONG_CONTEXT_COST, RESPONSE_CHUNKS, ROUTER_CACHE_PREDICTION,
    CACHE_MISS_DOLLARS, CACHE_MISS_TOKENS, TENANT_COST, TENANT_REQUESTS, ENERGY, IDLE_ENERGY,
    ENERGY_MEASURED, SLO_REQUESTS, SLO_DOLLARS, SLO_OBJECTIVE, SLO_CONFIG_INFO,
    KV_TRANSFER_BYTES,
)

# --- Build: what the install runs, on the collector's and the agent's /metrics
LABEL_VERSION: Final = "version"
LABEL_CORE: Final = "core"
LABEL_DECODER: Final = "decoder"
LABEL_COMPONENT: Final = "component"
BUILD_INFO = _m("build_info", "gauge", (LABEL_VERSION, LABEL_CORE, LABEL_DECODER),
                "1, labelled with the package version, the per-request core this process "
                "runs (compiled: mypyc; python) and its OTLP decoder (native: C; python).")
BUILD_FALLBACKS = _m("build_fallbacks", "counter", (LABEL_COMPONENT, LABEL_REASON),
                     "Parts of the install this process runs as plain Python, by component "
                     "(core, decoder) and reason (not_built, disabled, self_check_failed).")
BUILD_METRICS: tuple[MetricSpec, ...] = (BUILD_INFO, BUILD_FALLBACKS)

# --- Collector: self-telemetry
SPANS_RECEIVED = _m("collector_spans_received", "counter", (LABEL_RECEIVER,),
                    "Spans accepted by a receiver.")
SPANS_REJECTED = _m("collector_spans_rejected", "counter", (LABEL_RECEIVER, LABEL_REASON),
                    "Spans refused by a receiver, by reason.")
SPANS_DROPPED = _m("collector_spans_dropped", "counter", (LABEL_REASON,),
                   "Spans accepted but dropped later (limits, duplicates, late), by reason.")
SPANS_SUMMARISED = _m("collector_spans_summarised", "counter", (LABEL_REASON,),
                      "Spans folded into a summary on ingest, not kept (ASGI per-message "
                      "sub-spans: one per streamed chunk).")
TRACE_EXPORTS_DECODED = _m(
    "collector_trace_exports_decoded", "counter", ("decoder",),
    "OTLP trace export requests decoded, by decoder: compiled (the native decoder, a C "
    "extension; the label value predates the name) or "
    "reference (protobuf's parser: OTLP/JSON, a payload the native decoder leaves to it, "
    "or no native decoder built).")
ATTRIBUTES_DROPPED = _m("collector_attributes_dropped", "counter", (LABEL_REASON,),
                        "Span attributes dropped or truncated on ingest, by reason.")
SPANS_UNMAPPED = _m("collector_spans_unmapped", "counter", (),
                    "Spans that map to no stage and were ignored.")
TRACES_EVICTED = _m("collector_traces_evicted", "counter", (LABEL_REASON,),
                    "In-flight traces finalized early, by reason (capacity, idle_timeout).")
PIPELINE_ERRORS = _m("collector_pipeline_errors", "counter", ("step",),
                     "Traces or record batches lost to an error in a pipeline step "
                     "(hand_off: assembler to worker; trace: mapping and pricing a trace; "
                     "records: pricing forwarded records; pricing: a step of queued "
                     "closes); the error is logged.")
SINK_ERRORS = _m("collector_sink_errors", "counter", ("sink",),
                 "Records or idle slices a sink (store, Prometheus) failed to take.")
TRACES_IN_FLIGHT = _m("collector_traces_in_flight", "gauge", (),
                      "Traces being assembled.")
SPANS_BUFFERED = _m("collector_spans_buffered", "gauge", (), "Spans held in the assembler.")
RECORDS_STORED = _m("collector_records_stored", "counter", (),
                    "Request records written to the store.")
STORE_ERRORS = _m("collector_store_errors", "counter", (), "Store write failures.")
REQUESTS_REJECTED = _m("collector_export_requests_rejected", "counter",
                       (LABEL_RECEIVER, LABEL_STATUS),
                       "Export requests (OTLP/HTTP, gRPC, records) refused with an error "
                       "status, by receiver and status.")
LABEL_OVERFLOW = _m("collector_label_values_overflow", "counter", ("label",),
                    "Label values replaced by 'other' past the cardinality cap.")
METRIC_POINTS_RECEIVED = _m("collector_metric_points_received", "counter", (LABEL_RECEIVER,),
                            "OTLP metric data points accepted.")
METRIC_POINTS_DROPPED = _m("collector_metric_points_dropped", "counter", (LABEL_REASON,),
                           "OTLP metric data points dropped (series cap), by reason.")
SPAN_EVENTS_DROPPED = _m("collector_span_events_dropped", "counter", (LABEL_REASON,),
                         "Span events dropped on ingest (events per span, GenAI content).")
HTTP_CALLS_NOT_LLM = _m("collector_http_calls_not_llm", "counter", (LABEL_REASON,),
                        "HTTP server traces that were not LLM calls (health checks, docs "
                        "pages, 4xx/5xx on other routes): not requests.")
CALLS_JOINED = _m("collector_calls_joined", "counter", (LABEL_OUTCOME,),
                  "Client or proxy records of a call traced apart from its serving side, "
                  "by outcome: joined, late (its serving side already counted), alone, "
                  "ambiguous (no response id and several serving records fit: joined "
                  "none, dropped) or serving_after_alone (a serving side after its client "
                  "went alone: counted twice).")
PIPELINE_QUEUE_DEPTH = _m("collector_pipeline_queue_depth", "gauge", (),
                          "Traces and record batches waiting for the pipeline worker.")
RECORDS_FORWARDED = _m("collector_records_forwarded", "counter", (),
                       "Records exported to the pricing collector (--forward-records).")
RECORDS_DROPPED = _m("collector_records_dropped", "counter", (LABEL_REASON,),
                     "Request records lost after the export that carried them was "
                     "accepted, by reason (store_closed: the store had shut down; a "
                     "ClickHouse store's store_rejected: the server refused the batch, "
                     "store_shutdown: still queued at the shutdown deadline, "
                     "store_write_failed: past write_retry_seconds). Admission refuses "
                     "exports before a backed-up stage would drop: any count here is a bug, "
                     "a refusal or a shutdown race (docs/reliability.md).")
RECORDS_FORWARD_DROPPED = _m("collector_records_forward_dropped", "counter", (LABEL_REASON,),
                             "Records the forwarder gave up on, by reason.")
RECORDS_RECEIVED = _m("collector_records_received", "counter", (LABEL_RECEIVER,),
                      "Forwarded records accepted for pricing on /v1/logs.")
RECORDS_LATE = _m("collector_records_late", "counter", (),
                  "Records that arrived after their node's slices closed (charged from "
                  "the idle of the closed slices they overlap).")
RECORDS_DUPLICATE = _m("collector_records_duplicate", "counter", (),
                       "Records priced already and received again (a re-sent forwarded "
                       "batch): dropped.")
RECORDS_WITHOUT_TIMELINE = _m("collector_records_without_timeline", "counter", (),
                              "Records with no engine timeline: no GPU dollars apportioned.")
PRICING_FORCED_CLOSES = _m("collector_pricing_forced_closes", "counter", (),
                           "Times the attributor closed slices early (cost.max_pending_records).")
RECORDS_PENDING_PRICE = _m("collector_records_pending_price", "gauge", (),
                           "Records held until their node's slices close.")
PRICING_SOURCES_EXPIRED = _m("collector_pricing_sources_expired", "counter", (),
                             "Forwarding replicas that sent a unit no progress for "
                             "cost.source_timeout_seconds: the unit's window moved on "
                             "without them (their records that still come are priced late).")
PRICING_PROGRESS_IN = _m("collector_pricing_progress", "counter", (),
                         "Progress messages received from forwarding replicas (their "
                         "watermark per pricing unit, docs/deploy.md).")
PROGRESS_FORWARDED = _m("collector_progress_forwarded", "counter", (),
                        "Progress messages this forwarding replica sent (one per pricing "
                        "unit per progress interval).")
ENGINE_PLUGIN_STEPS = _m("collector_engine_plugin_steps", "counter", (LABEL_ENGINE,),
                         "Engine steps (iterations) the vLLM plugin reported, by engine.")
ENGINE_PLUGIN_STEP_SECONDS = _m("collector_engine_plugin_step_seconds", "counter",
                                (LABEL_ENGINE,),
                                "Seconds the engine's steps took, as the vLLM plugin "
                                "reported them: rate() is the engine's busy fraction.")
ENGINE_PLUGIN_EXPORT_DROPPED = _m("collector_engine_plugin_export_dropped", "counter",
                                  (LABEL_ENGINE,),
                                  "Items the vLLM plugin's bounded queue dropped (its own "
                                  "cumulative count, the latest reported), by engine.")
ENGINE_PLUGIN_EXPORT_FAILED = _m("collector_engine_plugin_export_failed_batches", "counter",
                                 (LABEL_ENGINE,),
                                 "Span batches the vLLM plugin failed to export (its own "
                                 "cumulative count, the latest reported), by engine.")
PRICING_RECORDS_IN = _m("collector_pricing_records_in", "counter", (),
                        "Records the cost attributor received.")
PRICING_RECORDS_OUT = _m("collector_pricing_records_out", "counter", (),
                         "Records the cost attributor priced and passed to the sinks.")
RECORDS_LATE_DOLLARS = _m("collector_records_late_dollars", "counter", (),
                          "Dollars charged to late records from the idle of the closed "
                          "slices they overlap (taken off the idle: "
                          "tokenpath_idle_cost_reclaimed_dollars_total).")
RECORDS_LATE_UNPRICED_DOLLARS = _m(
    "collector_records_late_unpriced_dollars", "counter", (),
    "Dollars late records would have been charged that the idle of their closed slices "
    "could not cover: not charged, so attributed plus idle stays the node's dollars.")
PRICING_STEPS = _m("collector_pricing_steps", "counter", (),
                   "Bounded pricing steps run (each closes at most "
                   "cost.max_slices_per_step slices and prices at most "
                   "cost.max_records_per_step records; the pipeline thread gives up the "
                   "GIL between two).")
PRICING_STEP_SLICES = _m("collector_pricing_step_slices", "gauge", (),
                         "Slices (and engine events) a pricing step may close at most "
                         "(cost.max_slices_per_step).")
PRICING_STEP_RECORDS = _m("collector_pricing_step_records", "gauge", (),
                          "Records a pricing step may price at most "
                          "(cost.max_records_per_step).")
PRICING_PENDING_CLOSES = _m("collector_pricing_pending_closes", "gauge", (),
                            "Pricing units whose slices wait to be closed by the next "
                            "pricing steps.")
ENERGY_WAITS_EXPIRED = _m("collector_pricing_energy_waits_expired", "counter", (),
                          "Times a metered node was closed past its GPU energy readings "
                          "(cost.energy_max_wait_seconds): those slices' joules are modeled.")
ENERGY_READINGS = _m("collector_energy_readings", "counter", (LABEL_OUTCOME,),
                     "GPU energy counter points from node agents, by outcome (kept, "
                     "out_of_order, counter_reset, over_gpu_cap).")
# Names kept working after a rename: the exporter also writes each under its old name.
RENAMED_FROM: dict[str, str] = {
    "collector_export_requests_rejected": "collector_http_requests_rejected",
}

# --- Agent: GPUs (NVML)
GPU_UTILIZATION = _m("gpu_utilization_ratio", "gauge", (LABEL_GPU,),
                     "Share of time a kernel was running (NVML utilization.gpu).")
GPU_MEMORY_USED = _m("gpu_memory_used_bytes", "gauge", (LABEL_GPU,), "HBM used.")
GPU_MEMORY_TOTAL = _m("gpu_memory_total_bytes", "gauge", (LABEL_GPU,), "HBM total.")
GPU_MEMORY_BW_UTIL = _m("gpu_memory_bandwidth_utilization_ratio", "gauge", (LABEL_GPU,),
                        "Share of time HBM was being read or written (NVML utilization.memory).")
GPU_POWER = _m("gpu_power_watts", "gauge", (LABEL_GPU,), "Board power draw.")
GPU_SM_CLOCK = _m("gpu_sm_clock_hertz", "gauge", (LABEL_GPU,), "SM clock.")
GPU_ENERGY = _m("gpu_energy_joules", "counter", (LABEL_GPU,),
                "GPU energy: NVML's total energy since the driver loaded, else board power "
                "integrated over the agent's samples.")
GPU_NVLINK_TX = _m("gpu_nvlink_transmit_bytes", "counter", (LABEL_GPU,),
                   "NVLink bytes transmitted.")
GPU_NVLINK_RX = _m("gpu_nvlink_receive_bytes", "counter", (LABEL_GPU,),
                   "NVLink bytes received.")
GPU_PCIE_TX = _m("gpu_pcie_transmit_bytes_per_second", "gauge", (LABEL_GPU,),
                 "PCIe transmit throughput.")
GPU_PCIE_RX = _m("gpu_pcie_receive_bytes_per_second", "gauge", (LABEL_GPU,),
                 "PCIe receive throughput.")
GPU_BUSY_SECONDS = _m("gpu_busy_seconds", "counter", (LABEL_GPU,),
                      "Integrated utilization x elapsed time.")

# --- Agent: NICs
NODE_NET_TX_BYTES = _m("node_network_transmit_bytes", "counter", (LABEL_DEVICE,),
                       "NIC bytes transmitted.")
NODE_NET_RX_BYTES = _m("node_network_receive_bytes", "counter", (LABEL_DEVICE,),
                       "NIC bytes received.")
NODE_NET_TX_PACKETS = _m("node_network_transmit_packets", "counter", (LABEL_DEVICE,),
                         "NIC packets transmitted.")
NODE_NET_RX_PACKETS = _m("node_network_receive_packets", "counter", (LABEL_DEVICE,),
                         "NIC packets received.")
NODE_NET_TX_DROPS = _m("node_network_transmit_drops", "counter", (LABEL_DEVICE,),
                       "NIC transmit drops.")
NODE_NET_RX_DROPS = _m("node_network_receive_drops", "counter", (LABEL_DEVICE,),
                       "NIC receive drops.")
NODE_NET_TX_AVG_PACKET = _m("node_network_transmit_average_packet_bytes", "gauge",
                            (LABEL_DEVICE,),
                            "Mean transmitted packet size over the last poll interval.")
NODE_NET_RX_AVG_PACKET = _m("node_network_receive_average_packet_bytes", "gauge",
                            (LABEL_DEVICE,),
                            "Mean received packet size over the last poll interval.")

# --- Agent: engine metrics, normalized from vLLM and SGLang
ENGINE_PREFIX_HIT_TOKENS = _m("engine_prefix_cache_hit_tokens", "counter",
                              (LABEL_ENGINE, LABEL_MODEL), "Prompt tokens served from cache.")
ENGINE_PREFIX_QUERY_TOKENS = _m("engine_prefix_cache_query_tokens", "counter",
                                (LABEL_ENGINE, LABEL_MODEL),
                                "Prompt tokens looked up in the prefix cache.")
ENGINE_REQUESTS_RUNNING = _m("engine_requests_running", "gauge", (LABEL_ENGINE, LABEL_MODEL),
                             "Requests in the running batch.")
ENGINE_REQUESTS_WAITING = _m("engine_requests_waiting", "gauge", (LABEL_ENGINE, LABEL_MODEL),
                             "Requests waiting to be scheduled.")
ENGINE_KV_USAGE = _m("engine_kv_cache_usage_ratio", "gauge", (LABEL_ENGINE, LABEL_MODEL),
                     "Share of KV-cache blocks in use.")
ENGINE_SPEC_DRAFT = _m("engine_spec_decode_draft_tokens", "counter",
                       (LABEL_ENGINE, LABEL_MODEL), "Speculative draft tokens proposed.")
ENGINE_SPEC_ACCEPTED = _m("engine_spec_decode_accepted_tokens", "counter",
                          (LABEL_ENGINE, LABEL_MODEL), "Speculative draft tokens accepted.")
ENGINE_PROMPT_TOKENS_CACHED = _m("engine_prompt_tokens_cached", "counter",
                                 (LABEL_ENGINE, LABEL_MODEL),
                                 "Prompt tokens the engine reports as served from any cache "
                                 "(vLLM prompt_tokens_cached).")
ENGINE_ESTIMATED_FLOPS = _m("engine_estimated_flops_per_gpu", "counter",
                            (LABEL_ENGINE, LABEL_MODEL),
                            "Engine-estimated FLOPs per GPU (vLLM estimated_flops_per_gpu).")
ENGINE_ESTIMATED_READ_BYTES = _m("engine_estimated_read_bytes_per_gpu", "counter",
                                 (LABEL_ENGINE, LABEL_MODEL),
                                 "Engine-estimated HBM bytes read per GPU "
                                 "(vLLM estimated_read_bytes_per_gpu).")
ENGINE_PREFIX_HIT_RATE = _m("engine_prefix_cache_hit_rate", "gauge",
                            (LABEL_ENGINE, LABEL_MODEL),
                            "Engine-reported recent prefix-cache hit rate (SGLang cache_hit_rate).")
ENGINE_SPEC_ACCEPT_LENGTH = _m("engine_spec_decode_accept_length", "gauge",
                               (LABEL_ENGINE, LABEL_MODEL),
                               "Engine-reported mean accepted length per speculative step "
                               "(SGLang spec_accept_length).")
ENGINE_PROMPT_TOKENS_BY_SOURCE = _m(
    "engine_prompt_tokens_by_source", "counter", (LABEL_ENGINE, LABEL_MODEL, LABEL_TOKEN_SOURCE),
    "Prompt tokens by where their KV came from: compute (prefilled here), local_cache "
    "(prefix cache hit), kv_transfer (another instance's KV, P/D).")
ENGINE_KV_TRANSFER_SECONDS = _m("engine_kv_transfer_seconds", "counter",
                                (LABEL_ENGINE, LABEL_MODEL),
                                "Seconds spent in KV-cache transfers (vLLM NIXL xfer time).")
ENGINE_KV_TRANSFERS = _m("engine_kv_transfers", "counter", (LABEL_ENGINE, LABEL_MODEL),
                         "KV-cache transfers (vLLM NIXL).")
ENGINE_KV_TRANSFER_BYTES = _m("engine_kv_transfer_bytes", "counter",
                              (LABEL_ENGINE, LABEL_MODEL),
                              "Bytes moved by KV-cache transfers (vLLM NIXL).")
ENGINE_KV_TRANSFER_FAILURES = _m("engine_kv_transfer_failures", "counter",
                                 (LABEL_ENGINE, LABEL_MODEL),
                                 "Failed KV-cache transfers (vLLM NIXL, SGLang P/D).")
ENGINE_KV_BLOCK_EVICTIONS = _m("engine_kv_block_evictions", "counter",
                               (LABEL_ENGINE, LABEL_MODEL),
                               "KV blocks evicted (sampled: vLLM --kv-cache-metrics-sample).")
ENGINE_KV_BLOCK_LIFETIME_SECONDS = _m("engine_kv_block_lifetime_seconds", "counter",
                                      (LABEL_ENGINE, LABEL_MODEL),
                                      "Summed lifetimes of the evicted KV blocks: / evictions "
                                      "is the mean residency.")
ENGINE_KV_BLOCK_IDLE_SECONDS = _m("engine_kv_block_idle_before_evict_seconds", "counter",
                                  (LABEL_ENGINE, LABEL_MODEL),
                                  "Summed idle time of the evicted KV blocks before eviction.")
ENGINE_STAGE_SECONDS = _m("engine_stage_seconds", "counter",
                          (LABEL_ENGINE, LABEL_MODEL, LABEL_STAGE),
                          "Seconds requests spent in each engine stage (SGLang "
                          "per_stage_req_latency_seconds, by its stage names).")
ENGINE_STAGE_REQUESTS = _m("engine_stage_requests", "counter",
                           (LABEL_ENGINE, LABEL_MODEL, LABEL_STAGE),
                           "Requests that went through each engine stage (SGLang).")

# --- Agent: KV-cache events (vLLM and SGLang publish them over ZeroMQ; agent/kv_index.py).
# ``engine`` is the engine's id (its topic), ``cause`` one of evicted, routed, cold, and on
# the stored-blocks counter also already_held (a re-store of a block held: not a miss).
KV_RECOMPUTED_TOKENS = _m("kv_recomputed_tokens", "counter",
                          (LABEL_ENGINE, LABEL_MODEL, LABEL_CAUSE),
                          "Prompt tokens an engine computed into full KV blocks it did not "
                          "hold, by measured cause: evicted (it removed the block earlier), "
                          "routed (another engine of the model on this node held it), cold.")
KV_STORED_BLOCKS = _m("kv_stored_blocks", "counter", (LABEL_ENGINE, LABEL_MODEL, LABEL_CAUSE),
                      "Full KV blocks an engine reported stored, by cause (evicted, routed, "
                      "cold, already_held).")
KV_REMOVED_BLOCKS = _m("kv_removed_blocks", "counter", (LABEL_ENGINE, LABEL_MODEL),
                       "KV blocks an engine reported removed (evicted).")
KV_BLOCK_LIFETIME_SECONDS = _m("kv_block_lifetime_seconds", "counter",
                               (LABEL_ENGINE, LABEL_MODEL),
                               "Summed time from store to removal of the removed blocks the "
                               "agent saw stored: / removed blocks is the mean residency.")
KV_EVICTED_GONE_SECONDS = _m("kv_evicted_gone_seconds", "counter",
                             (LABEL_ENGINE, LABEL_MODEL),
                             "Summed time evicted blocks had been gone when they were stored "
                             "again.")
KV_RESIDENT_BLOCKS = _m("kv_resident_blocks", "gauge", (LABEL_ENGINE, LABEL_MODEL),
                        "Distinct KV blocks the agent's index holds for an engine.")
KV_INDEX_RESETS = _m("kv_index_resets", "counter", (LABEL_ENGINE, LABEL_MODEL),
                     "Times an engine's index was emptied: AllBlocksCleared, or the "
                     "engine's batch sequence restarted.")
KV_EVENT_BATCHES = _m("kv_event_batches", "counter", (LABEL_ENGINE,),
                      "KV-event batches received and applied.")
KV_EVENTS_DROPPED = _m("kv_events_dropped", "counter", (LABEL_ENGINE, LABEL_REASON),
                       "KV-event batches (or blocks, for index_full) not applied: undecodable, "
                       "malformed, gap (batches missing from the sequence), index_full.")

# --- Agent: self-telemetry
AGENT_NVML_UP = _m("agent_nvml_up", "gauge", (), "1 when NVML initialized, 0 otherwise.")
AGENT_SCRAPE_ERRORS = _m("agent_scrape_errors", "counter", (LABEL_SOURCE,),
                         "Failures reading one device, file or endpoint.")
ENGINE_UP = _m("engine_up", "gauge", (LABEL_SOURCE,),
               "1 when an engine /metrics endpoint answered at the last poll, 0 otherwise.")
AGENT_POLL_SECONDS = _m("agent_poll_duration_seconds", "gauge", (),
                        "Wall time the last poll took.")
AGENT_OTLP_PUSH_ERRORS = _m("agent_otlp_push_errors", "counter", (),
                            "OTLP metric exports to the collector that failed.")
AGENT_METRICS: tuple[MetricSpec, ...] = (
    AGENT_NVML_UP, AGENT_SCRAPE_ERRORS, GPU_UTILIZATION, GPU_MEMORY_USED, GPU_MEMORY_TOTAL,
    GPU_MEMORY_BW_UTIL, GPU_POWER, GPU_SM_CLOCK, GPU_NVLINK_TX, GPU_NVLINK_RX, GPU_PCIE_TX,
    GPU_PCIE_RX, GPU_BUSY_SECONDS, NODE_NET_TX_BYTES, NODE_NET_RX_BYTES, NODE_NET_TX_PACKETS,
    NODE_NET_RX_PACKETS, NODE_NET_TX_DROPS, NODE_NET_RX_DROPS, ENGINE_PREFIX_HIT_TOKENS,
    ENGINE_PREFIX_QUERY_TOKENS, ENGINE_REQUESTS_RUNNING, ENGINE_REQUESTS_WAITING,
    ENGINE_KV_USAGE, ENGINE_SPEC_DRAFT, ENGINE_SPEC_ACCEPTED,
    NODE_NET_TX_AVG_PACKET, NODE_NET_RX_AVG_PACKET, ENGINE_PROMPT_TOKENS_CACHED,
    ENGINE_ESTIMATED_FLOPS, ENGINE_ESTIMATED_READ_BYTES, ENGINE_PREFIX_HIT_RATE,
    ENGINE_SPEC_ACCEPT_LENGTH, ENGINE_PROMPT_TOKENS_BY_SOURCE, ENGINE_KV_TRANSFER_SECONDS,
    ENGINE_KV_TRANSFERS, ENGINE_KV_TRANSFER_BYTES, ENGINE_KV_TRANSFER_FAILURES,
    ENGINE_KV_BLOCK_EVICTIONS, ENGINE_KV_BLOCK_LIFETIME_SECONDS, ENGINE_KV_BLOCK_IDLE_SECONDS,
    ENGINE_STAGE_SECONDS, ENGINE_STAGE_REQUESTS, ENGINE_UP, AGENT_POLL_SECONDS,
    AGENT_OTLP_PUSH_ERRORS, KV_RECOMPUTED_TOKENS, KV_STORED_BLOCKS, KV_REMOVED_BLOCKS,
    KV_BLOCK_LIFETIME_SECONDS, KV_EVICTED_GONE_SECONDS, KV_RESIDENT_BLOCKS, KV_INDEX_RESETS,
    KV_EVENT_BATCHES, KV_EVENTS_DROPPED,
)

# --- vLLM's engine metric names (vLLM V1 /metrics), as the reference serving path's
# simulated engine exposes them for the node agent to scrape like a real vLLM (counters
# without ``_total``)
VLLM_PREFIX_CACHE_QUERIES: Final = "vllm:prefix_cache_queries"  # counter, tokens
VLLM_PREFIX_CACHE_HITS: Final = "vllm:prefix_cache_hits"  # counter, tokens
VLLM_NUM_REQUESTS_RUNNING: Final = "vllm:num_requests_running"  # gauge
VLLM_NUM_REQUESTS_WAITING: Final = "vllm:num_requests_waiting"  # gauge
VLLM_KV_CACHE_USAGE: Final = "vllm:kv_cache_usage_perc"  # gauge, 0..1
VLLM_LABEL_MODEL_NAME: Final = "model_name"
VLLM_LABEL_ENGINE: Final = "engine"
