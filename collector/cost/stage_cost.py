"""Landing dollars on stages.

- GPU stages 7-10 split each phase's measured in-model time by the roofline (provenance
  modeled): ``gpu_dispatch`` is the host-side step overhead (kept as measured when the
  engine recorded it), ``nvlink`` the tensor-parallel collectives (TP > 1), and the rest
  splits into ``kernel_exec`` (compute-bound share) and ``hbm_load`` (memory-bound share).
  The four stages' seconds sum to the phase's in-model seconds; the phase's apportioned
  dollars split in proportion to seconds.
- CPU stages: measured seconds x CPU $/core-second (one core per stage second); client
  stages derived from a GenAI client span's gaps are wall time, not CPU, and carry none.
- Network stages: response bytes x $/byte, spread over the network stages present by their
  seconds.
"""

from __future__ import annotations

from tokenpath.records import PhaseShare, RequestRecord, StageTiming
from tokenpath.roofline import Roofline
from tokenpath.stage_members import (
    CLIENT_DECODE,
    CLIENT_TOKENIZE,
    DECODE,
    DERIVED,
    GPU_DISPATCH,
    GROUP_CLIENT,
    GROUP_GATEWAY,
    HBM_LOAD,
    KERNEL_EXEC,
    KV_CACHE_LOOKUP,
    KV_TRANSFER,
    MODELED,
    NVLINK,
    PREFILL,
)
from tokenpath.stages import GPU_STAGES, NETWORK_STAGES, STAGE_BY_ID, Phase, StageId

# Stages priced as CPU time. Waiting in the scheduler queue costs no extra hardware (the
# GPU it waits for is paid by the requests being served), so it carries no dollars.
CPU_STAGES: tuple[StageId, ...] = (
    *(stage.id for stage in STAGE_BY_ID.values()
      if stage.group in (GROUP_CLIENT, GROUP_GATEWAY)),
    KV_CACHE_LOOKUP,
)

# Client stages derived from a GenAI client span's gaps around the gateway (collector/
# call_join.add_client_gaps) hold the wire time and the client's wait: not priced as CPU.
CLIENT_GAP_STAGES: frozenset[StageId] = frozenset({CLIENT_TOKENIZE,
                                                   CLIENT_DECODE})


def _measured_dispatch(record: RequestRecord, phase: Phase, phase_seconds: float,
                       total_in_model: float) -> float | None:
    timing = record.stages.get(GPU_DISPATCH)
    if timing is None or timing.provenance is MODELED:
        return None
    if timing.phases:
        share = timing.phases.get(phase)
        seconds = share.seconds if share is not None else 0.0
    elif total_in_model > 0:
        seconds = timing.seconds * phase_seconds / total_in_model
    else:
        seconds = 0.0
    return min(max(0.0, seconds), phase_seconds)


def split_phase_seconds(
    roofline: Roofline | None,
    phase: Phase,
    phase_seconds: float,
    input_tokens: int,
    cached_tokens: int,
    output_tokens: int,
    decode_batch: float,
    measured_dispatch: float | None,
) -> dict[StageId, float]:
    """Seconds of one phase on each GPU stage; they sum to ``phase_seconds``."""
    if phase_seconds <= 0:
        return {}
    new_tokens = max(1, input_tokens - cached_tokens)
    decode_steps = max(0, output_tokens - 1)
    if roofline is None:
        dispatch = measured_dispatch or 0.0
        bulk = KERNEL_EXEC if phase is PREFILL else HBM_LOAD
        return {GPU_DISPATCH: dispatch, bulk: phase_seconds - dispatch}
    batch = max(1.0, decode_batch)
    if phase is PREFILL:
        steps = 1
        flops = roofline.prefill_flops(new_tokens, cached_tokens)
        nbytes = roofline.prefill_bytes(new_tokens, cached_tokens) + (
            roofline.model.weight_bytes / batch)
        nvlink = roofline.nvlink_seconds(new_tokens)
    else:
        steps = decode_steps
        mid_context = input_tokens + 1 + decode_steps // 2
        flops = steps * roofline.decode_flops(mid_context)
        nbytes = steps * (roofline.decode_bytes(mid_context) + roofline.model.weight_bytes / batch)
        nvlink = steps * roofline.nvlink_seconds(max(1, round(batch)))
    if measured_dispatch is not None:
        dispatch = measured_dispatch
    else:
        dispatch = min(phase_seconds, steps * roofline.step_overhead_seconds)
    nvlink = min(nvlink, phase_seconds - dispatch)
    rest = phase_seconds - dispatch - nvlink
    compute_share = roofline.compute_fraction(flops, nbytes)
    kernel = rest * compute_share
    return {
        GPU_DISPATCH: dispatch,
        HBM_LOAD: rest - kernel,
        KERNEL_EXEC: kernel,
        NVLINK: nvlink,
    }


def _measured_split(record: RequestRecord) -> bool:
    """True when the engine measured hbm_load or kernel_exec itself: keep its seconds."""
    return any(
        stage in record.stages and record.stages[stage].provenance is not MODELED
        for stage in (HBM_LOAD, KERNEL_EXEC)
    )


def _spread_over_existing(record: RequestRecord, phase_dollars: dict[Phase, float]) -> None:
    present = [record.stages[s] for s in GPU_STAGES if s in record.stages]
    total = sum(max(0.0, t.seconds) for t in present)
    dollars = sum(phase_dollars.values())
    for timing in present:
        timing.cost_dollars = dollars * max(0.0, timing.seconds) / total if total > 0 else 0.0


def land_gpu_cost(
    record: RequestRecord,
    roofline: Roofline | None,
    phase_seconds: dict[Phase, float],
    phase_dollars: dict[Phase, float],
    decode_batch: float,
) -> None:
    """Write stages 7-10 (seconds, dollars, per-phase split) onto ``record``.

    Replaces the mapper's default split (prefill -> kernel_exec, decode -> hbm_load);
    a measured gpu_dispatch keeps its seconds and provenance.
    """
    if _measured_split(record):
        _spread_over_existing(record, phase_dollars)
        return
    total_in_model = sum(phase_seconds.values())
    measured = {
        phase: _measured_dispatch(record, phase, phase_seconds.get(phase, 0.0), total_in_model)
        for phase in (PREFILL, DECODE)
    }
    dispatch_timing = record.stages.get(GPU_DISPATCH)
    for stage in GPU_STAGES:
        record.stages.pop(stage, None)
    per_stage: dict[StageId, dict[Phase, PhaseShare]] = {s: {} for s in GPU_STAGES}
    for phase in (PREFILL, DECODE):
        seconds = phase_seconds.get(phase, 0.0)
        dollars = phase_dollars.get(phase, 0.0)
        split = split_phase_seconds(
            roofline, phase, seconds, record.input_tokens, record.cache_read_tokens,
            record.output_tokens, decode_batch, measured[phase],
        )
        for stage, stage_seconds in split.items():
            per_stage[stage][phase] = PhaseShare(stage_seconds, dollars * stage_seconds / seconds)
    for stage, phases in per_stage.items():
        if not phases:
            continue
        provenance = MODELED
        if (stage is GPU_DISPATCH and dispatch_timing is not None
                and dispatch_timing.provenance is not MODELED):
            provenance = dispatch_timing.provenance
        record.stages[stage] = StageTiming(
            stage=stage,
            seconds=sum(p.seconds for p in phases.values()),
            provenance=provenance,
            cost_dollars=sum(p.cost_dollars for p in phases.values()),
            phases=phases,
        )


def has_kv_transfer(record: RequestRecord) -> bool:
    """Whether a network stage of the record holds a disaggregated KV transfer."""
    return any(KV_TRANSFER in record.stages[s].phases for s in NETWORK_STAGES
               if s in record.stages)


def land_cpu_and_network_cost(record: RequestRecord, cpu_dollars_per_core_second: float,
                              network_dollars_per_byte: float,
                              kv_bytes_per_token: float | None = None) -> None:
    """Price CPU stages by their seconds and network stages by the bytes they moved: the
    response bytes over the response's share of their seconds, and a disaggregated
    request's KV (the record's ``kv_transfer_bytes``, else its prompt tokens x the model's
    KV bytes per token; modeled) over the ``kv_transfer`` phase's share."""
    for stage in CPU_STAGES:
        timing = record.stages.get(stage)
        if timing is None:
            continue
        if stage in CLIENT_GAP_STAGES and timing.provenance is DERIVED:
            timing.cost_dollars = 0.0  # a GenAI client span's gap: wall time, the wire too
            continue
        timing.cost_dollars = max(0.0, timing.seconds) * cpu_dollars_per_core_second
    present = [record.stages[s] for s in NETWORK_STAGES if s in record.stages]
    if not present:
        return
    kv_shares = [(t, t.phases[KV_TRANSFER]) for t in present
                 if KV_TRANSFER in t.phases]
    kv_seconds = {t.stage: max(0.0, share.seconds) for t, share in kv_shares}
    # the response's part of each stage: what is not the KV transfer
    response_seconds = {t.stage: max(0.0, max(0.0, t.seconds) - kv_seconds.get(t.stage, 0.0))
                        for t in present}
    response = [t for t in present if t.stage not in kv_seconds or response_seconds[t.stage]]
    network_dollars = max(0, record.response_bytes) * network_dollars_per_byte
    total_seconds = sum(response_seconds[t.stage] for t in response)
    for timing in present:
        timing.cost_dollars = 0.0
    for timing in response or present:
        if total_seconds > 0:
            timing.cost_dollars = network_dollars * response_seconds[timing.stage] / total_seconds
        else:
            timing.cost_dollars = network_dollars / len(response or present)
    if not kv_shares:
        return
    if record.kv_transfer_bytes is not None:  # the mapper's count of what crossed
        kv_dollars = max(0, record.kv_transfer_bytes) * network_dollars_per_byte
    else:
        kv_dollars = (max(0, record.input_tokens) * (kv_bytes_per_token or 0.0)
                      * network_dollars_per_byte)
    total_kv = sum(kv_seconds.values())
    for timing, share in kv_shares:
        share.cost_dollars = (kv_dollars * kv_seconds[timing.stage] / total_kv if total_kv > 0
                              else kv_dollars / len(kv_shares))
        timing.cost_dollars += share.cost_dollars
