"""The views, defined once against the query interface (tokenpath/query.py): the report,
chargeback, the time series, the money leaks, and the what-ifs' samples.

Each view asks a store (:class:`tokenpath.query.RecordQueries`) for named aggregates over a
window and finishes them here; no view loads a window's records. Percentiles come from
log-bucket histograms, within ``QUANTILE_RELATIVE_ERROR`` (1%) of the exact ones. The
replays that need records (the routing what-if's cache replay, the repeated-prefix table,
the roofline what-if's calibration) read a bounded sample: the newest records of the
window, at most the limit below, and say so in their output.

Every view is computed here only, whichever the source: a store file, a ClickHouse
database, running collectors (tokenpath/cli/remote.py), or records in hand (a file, a
collector's ``/api/requests``, a made-up one), which :func:`over_records` loads into an
in-memory store first. The record-list functions the tests check these against (the report,
chargeback, the time series and the leaks computed from a list of records) are oracles in
testkit/oracles, not part of the package.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tokenpath.collector.cost.cache import DEFAULT_BLOCK_TOKENS, replay_prefixes
from tokenpath.collector.cost.catalog import catalog_model_name
from tokenpath.collector.cost.chargeback import ChargebackRow, IdlePolicy, allocate_idle
from tokenpath.collector.cost.leak_ranking import COALESCE_FIX_TOKENS, RankedLeak
from tokenpath.collector.cost.longcontext import ROOFLINE_GPU, ContextBucketSpend
from tokenpath.collector.cost.routing_whatif import MAX_REPLAY_RECORDS, prefix_affine_whatif
from tokenpath.collector.store.base import MEMORY, StoreConfig
from tokenpath.collector.store.sqlite import RecordStore
from tokenpath.last_mile import COALESCE_WHATIF_TOKENS, LastMileSummary
from tokenpath.leaks import (
    LONG_CONTEXT_TOKENS,
    WASTE_CAUSES,
    MissCause,
    context_bucket_edges,
    context_bucket_labels,
)
from tokenpath.metric_names import TENANT_UNATTRIBUTED
from tokenpath.query import (
    CAUSE_MEASURES,
    CONTEXT_BUCKETS,
    CORE,
    DEFAULT_PACKETS_PER_TOKEN_THRESHOLD,
    HISTOGRAMS,
    LAST_MILE,
    PHASE_MEASURES,
    QUANTILE_RELATIVE_ERROR,
    SLO_GROUP,
    SLO_MEASURES,
    STAGE_MEASURES,
    Aggregates,
    Params,
    RecordQueries,
    Sample,
    TimeBuckets,
    Window,
    quantile,
)
from tokenpath.records import IdleCost, RequestRecord
from tokenpath.report import MissCauseSummary, Report, StageSummary
from tokenpath.roofline import GPUS, MODELS, Roofline
from tokenpath.slo import (
    OUTCOME_MET,
    OUTCOME_MISSED,
    OUTCOMES,
    SloConfig,
    SloSummary,
    summary_from_counts,
)
from tokenpath.stages import RESPONSE_PATH_STAGES, STAGES, Phase, Provenance
from tokenpath.wire_sizes import PACKET_OVERHEAD_BYTES

# The newest records of a window the record replays read.
WHATIF_SAMPLE_LIMIT = 20_000
PREFIX_SAMPLE_LIMIT = 20_000
PROVENANCE_OF_RANK: dict[int, Provenance] = {
    0: Provenance.MEASURED, 1: Provenance.DERIVED, 2: Provenance.MODELED}

REPORT_MEASURES = (*CORE, *STAGE_MEASURES, *PHASE_MEASURES, *CAUSE_MEASURES, "lc_n", "lc_cost",
                   *LAST_MILE, "set:models", "set:units", "set:unit_gpus")
CHARGEBACK_MEASURES = ("n", "input_tokens_pos", "output_tokens_pos", "cost", "energy_pos",
                       "energy_measured_n", "energy_other_n")
CHARGEBACK_SLO_MEASURES = (*(f"slo_n:{o}" for o in OUTCOMES), f"slo_c:{OUTCOME_MISSED}")
GROUPS = ("tenant", "model", "pool")


def _one(groups: dict[Any, Aggregates]) -> Aggregates:
    return groups.get(None) or Aggregates()


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def energy_provenance_of(agg: Aggregates) -> str | None:
    """``measured`` when every priced record's energy was, ``modeled`` when any was not."""
    if agg.count("energy_other_n"):
        return Provenance.MODELED.value
    if agg.count("energy_measured_n"):
        return Provenance.MEASURED.value
    return None


def miss_causes_of(agg: Aggregates) -> dict[str, MissCauseSummary]:
    return {c.value: MissCauseSummary(c, agg.count(f"mt:{c.value}"), agg[f"md:{c.value}"])
            for c in MissCause}


def last_mile_of(agg: Aggregates,
                 threshold: float = DEFAULT_PACKETS_PER_TOKEN_THRESHOLD) -> LastMileSummary:
    """The last-mile summary (tokenpath/last_mile.py) from the last-mile measures."""
    tokens = agg["lm_tokens"]
    payload = agg["lm_bytes"]

    def ratios(packets: float) -> tuple[float | None, float | None]:
        return (_ratio(packets, tokens),
                (payload + packets * PACKET_OVERHEAD_BYTES) / payload if payload else None)

    ppt, wire = ratios(agg["lm_packets"])
    response = agg["lm_resp_s"]
    return LastMileSummary(
        streams=agg.count("lm_streams"),
        leaking_streams=agg.count("lm_leaking"),
        threshold=threshold,
        packets_per_output_token=ppt,
        wire_bytes_per_payload_byte=wire,
        response_seconds_per_output_token=response / tokens if tokens and response else None,
        engine_tpot_seconds=_ratio(agg["lm_tpot_sum"], agg["lm_tpot_n"]),
        packets_estimated_from_writes=agg.count("lm_est_n") > 0,
        coalescing={n: ratios(agg[f"lm_coal:{n}"]) for n in COALESCE_WHATIF_TOKENS},
    )


# --- the report -------------------------------------------------------------------------------


def report_view(q: RecordQueries, window: Window, slo: SloConfig | None = None) -> Report:
    """The per-stage report (tokenpath/report.py) over the window, from aggregates; idle
    dollars and joules are the store's for the window. ``slo``: the classes, for their
    objectives. Oracle: testkit/oracles/report.py build_report."""
    agg = _one(q.aggregate(window, REPORT_MEASURES, HISTOGRAMS))
    idle = q.idle_cost_dollars(window.since_unix)
    idle_joules = q.idle_energy_joules(window.since_unix)
    n = agg.count("n")
    window_seconds = (agg["max_end"] - agg["min_start"]) if n else 0.0
    total_stage_seconds = sum(agg[f"st_s:{s.id.value}"] for s in STAGES)
    stages = []
    for stage in STAGES:
        sid = stage.id.value
        count = agg.count(f"st_n:{sid}")
        seconds = agg[f"st_s:{sid}"]
        hist = agg.histogram(f"stage:{sid}")
        rank = agg.get(f"max_prov:{sid}")
        present = [p for p in Phase if agg.get(f"ph_s:{sid}:{p.value}") is not None]
        stages.append(StageSummary(
            stage=stage.id, requests=count,
            p50_seconds=quantile(hist, 0.5), p95_seconds=quantile(hist, 0.95),
            mean_seconds=seconds / count if count else None,
            cost_dollars=agg[f"st_c:{sid}"],
            provenance=None if rank is None or not count else PROVENANCE_OF_RANK[int(rank)],
            share_of_latency=seconds / total_stage_seconds if total_stage_seconds else 0.0,
            phase_seconds={p: agg[f"ph_s:{sid}:{p.value}"] for p in present},
            phase_cost_dollars={p: agg[f"ph_c:{sid}:{p.value}"] for p in present},
        ))
    output_tokens = agg.count("output_tokens")
    input_tokens = agg.count("input_tokens")
    cost = agg["cost"]
    chunks = agg.count("response_chunks")
    long_cost = agg["lc_cost"]
    last_mile = last_mile_of(agg)
    report = Report(
        requests=n,
        complete_requests=agg.count("complete_n"),
        window_seconds=window_seconds,
        stages=stages,
        ttft_p50_seconds=quantile(agg.histogram("ttft"), 0.5),
        ttft_p95_seconds=quantile(agg.histogram("ttft"), 0.95),
        tpot_p50_seconds=quantile(agg.histogram("tpot"), 0.5),
        output_tokens_per_second=output_tokens / window_seconds if window_seconds > 0 else 0.0,
        input_tokens=input_tokens,
        cache_read_tokens=agg.count("cache_read_tokens"),
        output_tokens=output_tokens,
        prefix_cache_hit_ratio=(agg.count("cache_read_tokens") / input_tokens
                                if input_tokens > 0 else None),
        cost_dollars=cost,
        idle_cost_dollars=idle,
        cache_miss_waste_dollars=agg["waste"],
        naive_cost_dollars=agg["naive_cost"],
        cost_per_million_output_tokens=((cost + idle) / output_tokens * 1e6
                                        if output_tokens else None),
        prefill_seconds=agg["prefill_seconds"],
        decode_seconds=agg["decode_seconds"],
        small_packet_share=agg.count("small_chunks") / chunks if chunks else None,
        long_context_requests=agg.count("lc_n"),
        long_context_cost_dollars=long_cost,
        long_context_share_of_cost=long_cost / cost if cost > 0 else None,
        models=sorted(agg.set("set:models")),
        simulated=agg.count("simulated_n") > 0,
        units_without_inventory=sorted(agg.set("set:units")),
        miss_by_cause=miss_causes_of(agg),
        packets_per_output_token=last_mile.packets_per_output_token,
        wire_bytes_per_payload_byte=last_mile.wire_bytes_per_payload_byte,
        leaking_streams=last_mile.leaking_streams,
        streams=last_mile.streams,
        energy_joules=agg["energy"],
        idle_energy_joules=idle_joules,
        energy_provenance=energy_provenance_of(agg),
    )
    report.window = window_json(q, window)
    report.slo = slo_view(q, window, window_seconds, agg.set("set:unit_gpus"), slo)
    return report


def slo_view(q: RecordQueries, window: Window, window_seconds: float | None = None,
             unit_gpus: set[str] | None = None,
             config: SloConfig | None = None) -> SloSummary | None:
    """The window's SLO classes (tokenpath/slo.py): goodput, goodput per GPU billed,
    dollars per good request, missed dollars by dominant stage; None when no record of
    the window has a class. ``config`` gives the classes' objectives."""
    if window_seconds is None or unit_gpus is None:
        agg = _one(q.aggregate(window, ("n", "min_start", "max_end", "set:unit_gpus")))
        window_seconds = (agg["max_end"] - agg["min_start"]) if agg.count("n") else 0.0
        unit_gpus = agg.set("set:unit_gpus")
    groups = q.aggregate(window, SLO_MEASURES, group_by=SLO_GROUP)
    return summary_from_counts({k: a.values for k, a in groups.items()}, window_seconds,
                               unit_gpus, config)


def window_json(q: RecordQueries, window: Window) -> dict[str, Any]:
    """The window a view covers, what the store keeps, and how its percentiles were had."""
    out = q.coverage().to_json(window)
    out["quantile_relative_error"] = QUANTILE_RELATIVE_ERROR
    return out


# --- chargeback -------------------------------------------------------------------------------


def chargeback_view(q: RecordQueries, window: Window,
                    policy: IdlePolicy = IdlePolicy.PROPORTIONAL,
                    by: str = "tenant") -> list[ChargebackRow]:
    """Chargeback (collector/cost/chargeback.py) over the window, grouped by ``by``
    (tenant, model or pool; ``unattributed`` for none), idle allocated by ``policy``.
    Oracle: testkit/oracles/chargeback.py."""
    if by not in GROUPS:
        raise ValueError(f"chargeback by {by!r}: one of {', '.join(GROUPS)}")
    rows: dict[str, ChargebackRow] = {}
    kinds: dict[str, Aggregates] = {}
    measures = (*CHARGEBACK_MEASURES, *CHARGEBACK_SLO_MEASURES)
    for key, agg in q.aggregate(window, measures, group_by=by).items():
        name = key or TENANT_UNATTRIBUTED
        row = rows.setdefault(name, ChargebackRow(name))
        row.requests += agg.count("n")
        row.input_tokens += agg.count("input_tokens_pos")
        row.output_tokens += agg.count("output_tokens_pos")
        row.cost_dollars += agg["cost"]
        row.energy_joules += agg["energy_pos"]
        row.slo_requests += sum(agg.count(f"slo_n:{o}") for o in OUTCOMES)
        row.good_requests += agg.count(f"slo_n:{OUTCOME_MET}")
        row.missed_slo_dollars += agg[f"slo_c:{OUTCOME_MISSED}"]
        kinds.setdefault(name, Aggregates()).merge(agg)
    for name, row in rows.items():
        row.energy_provenance = energy_provenance_of(kinds[name])
    return allocate_idle(list(rows.values()), q.idle_cost_dollars(window.since_unix), policy,
                         q.idle_energy_joules(window.since_unix))


# --- time series ------------------------------------------------------------------------------

TIMESERIES_MEASURES = ("n", "input_tokens", "cache_read_tokens", "output_tokens", "cost",
                       "waste")


def timeseries_view(q: RecordQueries, window: Window, buckets: int) -> dict[str, Any]:
    """``/api/timeseries`` over the window: per bucket of end time, requests, the
    token-weighted hit ratio, TTFT p50, output tokens/s and dollars; empty buckets keep
    their place with null ratios. Oracle: testkit/oracles/timeseries.py."""
    ends = q.end_range(window)
    if ends is None:
        return {"bucket_seconds": 0.0, "start_unix": None, "points": []}
    start, end = ends
    width = max((end - start) / buckets, 1e-9) if end > start else 1.0
    if end <= start:
        buckets = 1
    groups = q.aggregate(window, TIMESERIES_MEASURES, ("ttft",),
                         group_by=TimeBuckets(start, width, buckets))
    points = []
    for index in range(buckets):
        agg = groups.get(index) or Aggregates()
        inputs = agg.count("input_tokens")
        points.append({
            "start_unix": start + index * width,
            "requests": agg.count("n"),
            "prefix_cache_hit_ratio": (agg.count("cache_read_tokens") / inputs
                                       if inputs > 0 else None),
            "ttft_p50_seconds": quantile(agg.histogram("ttft"), 0.5),
            "output_tokens_per_second": agg.count("output_tokens") / width if width > 0 else 0.0,
            "cost_dollars": agg["cost"],
            "cache_miss_waste_dollars": agg["waste"],
        })
    return {"bucket_seconds": width, "start_unix": start, "points": points,
            "quantile_relative_error": QUANTILE_RELATIVE_ERROR}


# --- leaks ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelConstants:
    """A catalog model's prefill roofline: ``2 x params`` and ``4 x layers x attention dim``
    (tokenpath.roofline.Roofline.prefill_flops)."""

    linear: float
    attention: float


def model_constants(model: str) -> ModelConstants | None:
    name = catalog_model_name(model)
    if name is None:
        return None
    roofline = Roofline(GPUS[ROOFLINE_GPU], MODELS[name])
    return ModelConstants(2.0 * roofline.model.params,
                          4.0 * roofline.model.layers * roofline.model.attention_dim)


def _params(q: RecordQueries, window: Window, long_context_tokens: int,
            packets_per_token_threshold: float) -> Params:
    """The parameters with the roofline constants of the window's models."""
    models = _one(q.aggregate(window, ("set:models",))).set("set:models")
    constants = []
    for model in sorted(models):
        found = model_constants(model)
        if found is not None:
            constants.append((model, found.linear, found.attention))
    return Params(long_context_tokens=long_context_tokens,
                  packets_per_token_threshold=packets_per_token_threshold,
                  model_constants=tuple(constants))


def spend_by_context_bucket_view(q: RecordQueries, window: Window,
                                 totals: Aggregates) -> list[ContextBucketSpend]:
    """collector/cost/longcontext.spend_by_context_bucket from the context-bucket measures
    (the roofline terms summed per model)."""
    buckets = [ContextBucketSpend(label) for label in context_bucket_labels()]
    for i, bucket in enumerate(buckets):
        bucket.requests = totals.count(f"cb_n:{i}")
        bucket.cost_dollars = totals[f"cb_cost:{i}"]
    terms = tuple(f"{kind}:{i}" for i in range(CONTEXT_BUCKETS) for kind in ("cb_new", "cb_q"))
    for model, agg in q.aggregate(window, terms, group_by="model").items():
        constants = None if model is None else model_constants(model)
        if constants is None:
            continue
        for i, bucket in enumerate(buckets):
            attention = constants.attention * agg[f"cb_q:{i}"]
            bucket.prefill_flops += constants.linear * agg[f"cb_new:{i}"] + attention
            bucket.attention_flops += attention
    total = totals["cost"]
    for bucket in buckets:
        bucket.share_of_spend = bucket.cost_dollars / total if total > 0 else 0.0
    return buckets


LEAK_MEASURES = ("n", "priced_n", "fingerprinted_n", "input_tokens", "cache_read_tokens",
                 "waste", "cost", "prefill_seconds", "prefill_cost", "response_chunks",
                 "small_chunks", "response_bytes", *CAUSE_MEASURES,
                 *(f"{kind}:{s.id.value}" for s in STAGES for kind in ("st_s", "st_c")),
                 *(f"{kind}:{i}" for i in range(CONTEXT_BUCKETS)
                   for kind in ("cb_n", "cb_cost", "cb_prefill_s")),
                 *LAST_MILE)
LONG_MEASURES = ("lc_n", "lc_cost", "lc_prefill_s", "lc_prefill_c", "last_doubling")


def prefix_sample(q: RecordQueries, window: Window) -> Sample:
    return q.sample(window, PREFIX_SAMPLE_LIMIT, fingerprinted=True)


def leaks_view(q: RecordQueries, window: Window, limit: int = 10,
               long_context_tokens: int = LONG_CONTEXT_TOKENS,
               block_tokens: int = DEFAULT_BLOCK_TOKENS,
               packets_per_token_threshold: float = DEFAULT_PACKETS_PER_TOKEN_THRESHOLD,
               network_dollars_per_byte: float = 0.0) -> dict[str, Any]:
    """``/api/leaks`` over the window: the three money leaks of README.md (cache misses,
    long contexts, small packets and the last mile) and their ranking. The repeated-prefix
    table replays the newest PREFIX_SAMPLE_LIMIT fingerprinted records
    (``cache.replayed``). Oracle: testkit/oracles/leaks.py leaks_view."""
    params = _params(q, window, long_context_tokens, packets_per_token_threshold)
    agg = _one(q.aggregate(window, (*LEAK_MEASURES, *LONG_MEASURES), params=params))
    default_long = (agg if long_context_tokens == LONG_CONTEXT_TOKENS else _one(q.aggregate(
        window, LONG_MEASURES, params=Params(model_constants=params.model_constants))))
    sample = prefix_sample(q, window)
    tracker = replay_prefixes(sample.records, block_tokens)
    n = agg.count("n")
    inputs = agg.count("input_tokens")
    buckets = spend_by_context_bucket_view(q, window, agg)
    histogram = []
    for (low, high), label, i, bucket in zip(context_bucket_edges(), context_bucket_labels(),
                                             range(CONTEXT_BUCKETS), buckets, strict=True):
        histogram.append({
            "label": label, "min_tokens": low, "max_tokens": high,
            "requests": agg.count(f"cb_n:{i}"), "cost_dollars": agg[f"cb_cost:{i}"],
            "prefill_seconds": agg[f"cb_prefill_s:{i}"],
            "attention_share_of_prefill_flops": bucket.attention_share,
        })
    total_cost, total_prefill = agg["cost"], agg["prefill_seconds"]
    total_prefill_cost = agg["prefill_cost"]
    computed_tokens = agg.count("input_tokens") - agg.count("cache_read_tokens")
    chunks = agg.count("response_chunks")
    path_seconds = sum(agg[f"st_s:{s.value}"] for s in RESPONSE_PATH_STAGES)
    all_seconds = sum(agg[f"st_s:{s.id.value}"] for s in STAGES)
    causes = miss_causes_of(agg)
    return {
        "requests": n,
        "priced": agg.count("priced_n") > 0,
        "window": window_json(q, window),
        "cache": {
            "source": "records",
            "block_tokens": block_tokens,
            "block_tokens_used": sorted({r.prefix_block_tokens or block_tokens
                                         for r in sample.records}),
            "prefix_cache_hit_ratio": (agg.count("cache_read_tokens") / inputs
                                       if inputs > 0 else None),
            "cache_miss_waste_dollars": agg["waste"],
            # what a prompt token computed (not read from the cache) cost in prefill over
            # the window: prices the engines' measured recomputation (KV-cache events)
            "prefill_dollars_per_computed_token": (
                total_prefill_cost / computed_tokens
                if agg.count("priced_n") > 0 and computed_tokens > 0 else None),
            "requests_with_fingerprints": agg.count("fingerprinted_n"),
            "recomputed_prefix_tokens": tracker.recomputed_tokens,
            "by_cause": {cause: summary.to_json() for cause, summary in causes.items()},
            "top_prefixes": [p.to_json() for p in tracker.top_by_waste(limit)],
            "replayed": sample.to_json(),
        },
        "long_context": {
            "threshold_tokens": long_context_tokens,
            "requests": agg.count("lc_n"),
            "share_of_requests": agg.count("lc_n") / n if n else None,
            "share_of_cost": agg["lc_cost"] / total_cost if total_cost > 0 else None,
            "share_of_prefill_seconds": (agg["lc_prefill_s"] / total_prefill
                                         if total_prefill > 0 else None),
            "share_of_prefill_cost": (agg["lc_prefill_c"] / total_prefill_cost
                                      if total_prefill_cost > 0 else None),
            "histogram": histogram,
            "last_doubling_prefill_dollars": agg["last_doubling"],
        },
        "small_packets": {
            "response_chunks": chunks,
            "small_chunks": agg.count("small_chunks"),
            "share": agg.count("small_chunks") / chunks if chunks else None,
            "mean_chunk_bytes": agg.count("response_bytes") / chunks if chunks else None,
            "response_path_share_of_latency": (path_seconds / all_seconds
                                               if all_seconds else None),
            "response_path_cost_dollars": sum(agg[f"st_c:{s.value}"]
                                              for s in RESPONSE_PATH_STAGES),
        },
        "last_mile": last_mile_of(agg, packets_per_token_threshold).to_json(),
        "ranked": ([leak.to_json() for leak in _rank(agg, default_long, causes,
                                                      network_dollars_per_byte, None)]
                   if n else []),
    }


RANK_MEASURES = (*CAUSE_MEASURES, "lm_resp_c", "lm_packets", f"lm_coal:{COALESCE_FIX_TOKENS}",
                 "lc_n", "lc_cost", "last_doubling", "n")


def rank_leaks_view(q: RecordQueries, window: Window, network_dollars_per_byte: float,
                    replay_routing: bool = True) -> list[RankedLeak]:
    """The leaks ranked (collector/cost/leak_ranking.py) over the window. With
    ``replay_routing``, routed misses are priced by the routing what-if over the newest
    MAX_REPLAY_RECORDS fingerprinted records. Oracle: testkit/oracles/leaks.py
    rank_leaks."""
    params = _params(q, window, LONG_CONTEXT_TOKENS, DEFAULT_PACKETS_PER_TOKEN_THRESHOLD)
    agg = _one(q.aggregate(window, RANK_MEASURES, params=params))
    sample = None
    causes = miss_causes_of(agg)
    top = max((causes[c.value] for c in WASTE_CAUSES), key=lambda m: m.dollars)
    if (replay_routing and top.cause is MissCause.ROUTED_ELSEWHERE and top.dollars > 0):
        sample = q.sample(window, MAX_REPLAY_RECORDS, fingerprinted=True)
    return _rank(agg, agg, causes, network_dollars_per_byte, sample)


def _rank(agg: Aggregates, long: Aggregates, causes: dict[str, MissCauseSummary],
          dollars_per_byte: float, routing_sample: Sample | None) -> list[RankedLeak]:
    waste = {c: causes[c.value] for c in WASTE_CAUSES}
    top = max(waste.values(), key=lambda m: m.dollars)
    dollars = sum(m.dollars for m in waste.values())
    if routing_sample is not None:
        routed = prefix_affine_whatif(routing_sample.records)
        gain = routed.hit_ratio_gain or 0.0
        cache = RankedLeak("cache_misses", dollars, top.fix,
                           max(0.0, routed.prefill_dollars_saved),
                           f"a prefix-affine router: hit ratio +{gain:.1%} (replayed over "
                           f"the newest {len(routing_sample.records):,} of "
                           f"{routing_sample.of:,} fingerprinted requests)")
    else:
        cache = RankedLeak("cache_misses", dollars, top.fix, top.dollars,
                           f"the {top.cause.value} misses' prefill (an upper bound)")
    long_ = RankedLeak(
        "long_contexts", long["lc_cost"],
        f"cap, summarise or retrieve contexts past {LONG_CONTEXT_TOKENS:,} tokens; cache the "
        "shared part", long["last_doubling"],
        f"halving the {long.count('lc_n')} long contexts (their last doubling's prefill)")
    framing = agg["lm_packets"] * PACKET_OVERHEAD_BYTES * dollars_per_byte
    coalesced = agg[f"lm_coal:{COALESCE_FIX_TOKENS}"] * PACKET_OVERHEAD_BYTES * dollars_per_byte
    last_mile = RankedLeak(
        "last_mile", agg["lm_resp_c"] + framing,
        f"write {COALESCE_FIX_TOKENS} tokens per streamed chunk (or flush on a timer)",
        max(0.0, framing - coalesced),
        f"the framing of {COALESCE_FIX_TOKENS}-token writes instead of one per token")
    return sorted([cache, long_, last_mile], key=lambda leak: -leak.dollars)


# --- the record replays -----------------------------------------------------------------------


def whatif_sample(q: RecordQueries, window: Window,
                  limit: int = WHATIF_SAMPLE_LIMIT) -> Sample:
    """The records the roofline what-if calibrates on: the newest ``limit`` of the window."""
    return q.sample(window, limit)


# --- records in hand --------------------------------------------------------------------------


@contextmanager
def over_records(records: Iterable[RequestRecord],
                 idle: Iterable[IdleCost] = ()) -> Iterator[RecordQueries]:
    """The read interface over records in hand (and the idle GPU time ``idle`` priced): an
    in-memory SQLite store (collector/store/sqlite.py) loaded with them, shut when the block ends.
    The views over it are the views over any store."""
    store = RecordStore(StoreConfig(path=MEMORY))
    try:
        store.start()  # its writer writes them in batches
        for record in records:
            store.consume_record(record)
        for cost in idle:
            store.consume_idle_cost(cost)
        store.flush()
        yield store
    finally:
        store.shutdown()
