"""The 15 stages of an LLM request's path: the one table every other part imports.

docs/stages.md. Instrumentation, collector, dashboards, UI and docs read stage ids,
their order and what bounds them from here; nothing else spells a stage id.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class StageId(StrEnum):
    """Canonical stage ids, in path order."""

    CLIENT_TOKENIZE = "client_tokenize"
    API_GATEWAY = "api_gateway"
    AUTH_RATELIMIT = "auth_ratelimit"
    ROUTER = "router"
    SCHEDULER_QUEUE = "scheduler_queue"
    KV_CACHE_LOOKUP = "kv_cache_lookup"
    GPU_DISPATCH = "gpu_dispatch"
    HBM_LOAD = "hbm_load"
    KERNEL_EXEC = "kernel_exec"
    NVLINK = "nvlink"
    SWITCH_HOP = "switch_hop"
    NIC_TX = "nic_tx"
    ETHERNET_SERIALIZE = "ethernet_serialize"
    RESPONSE_PATH = "response_path"
    CLIENT_DECODE = "client_decode"


class Phase(StrEnum):
    """Engine phase: prefill is compute-bound, decode is memory-bandwidth-bound."""

    PREFILL = "prefill"
    DECODE = "decode"
    # Disaggregated serving: the prompt's KV moved from the prefill engine to the decode
    # engine (SGLang's prefill_transfer_kv_cache slice), on the network stages.
    KV_TRANSFER = "kv_transfer"


class Provenance(StrEnum):
    """How a stage figure was obtained. A modeled number is never shown as measured."""

    MEASURED = "measured"  # a span or counter timed it
    DERIVED = "derived"  # arithmetic on measured values (bytes / link rate)
    MODELED = "modeled"  # a documented roofline or apportionment model


# Weakest first when figures of several provenances combine: the result is labelled with
# the weakest (a sum with one modeled part is modeled).
PROVENANCE_RANK: dict[Provenance, int] = {
    Provenance.MEASURED: 0, Provenance.DERIVED: 1, Provenance.MODELED: 2}


class StageGroup(StrEnum):
    """Where on the path a stage sits; decides how its cost is priced."""

    CLIENT = "client"
    GATEWAY = "gateway"
    ENGINE = "engine"
    GPU = "gpu"
    NETWORK = "network"


# The plain ``str`` value of every stage, phase and provenance member, for code that runs
# per stage of every request: reading a member's ``.value`` is a descriptor call (about
# 0.1 µs in CPython 3.11), a lookup here a few nanoseconds.
PLAIN_VALUES: dict[StrEnum, str] = {
    member: member.value for kind in (StageId, Phase, Provenance) for member in kind
}


@dataclass(frozen=True, slots=True)
class Stage:
    id: StageId
    order: int
    title: str
    emitted_by: str
    bound_by: str
    group: StageGroup


STAGES: tuple[Stage, ...] = (
    Stage(StageId.CLIENT_TOKENIZE, 1, "Client tokenization", "client SDK shim", "CPU",
          StageGroup.CLIENT),
    Stage(StageId.API_GATEWAY, 2, "API gateway", "gateway shim (ASGI middleware)",
          "CPU / network", StageGroup.GATEWAY),
    Stage(StageId.AUTH_RATELIMIT, 3, "Auth and rate limit", "gateway shim", "CPU",
          StageGroup.GATEWAY),
    Stage(StageId.ROUTER, 4, "Router", "router shim", "CPU", StageGroup.GATEWAY),
    Stage(StageId.SCHEDULER_QUEUE, 5, "Scheduler queue",
          "engine hook; vLLM gen_ai.latency.time_in_queue", "queueing", StageGroup.ENGINE),
    Stage(StageId.KV_CACHE_LOOKUP, 6, "KV-cache lookup",
          "engine hook (prefix match, cached tokens)", "memory", StageGroup.ENGINE),
    Stage(StageId.GPU_DISPATCH, 7, "GPU dispatch",
          "engine hook (host-side step overhead, launch)", "CPU / PCIe", StageGroup.GPU),
    Stage(StageId.HBM_LOAD, 8, "HBM load", "memory-bound share of in-model GPU time",
          "HBM bandwidth (decode)", StageGroup.GPU),
    Stage(StageId.KERNEL_EXEC, 9, "Kernel execution",
          "compute-bound share of in-model GPU time", "FLOPs (prefill)", StageGroup.GPU),
    Stage(StageId.NVLINK, 10, "NVLink", "tensor-parallel collectives", "interconnect",
          StageGroup.GPU),
    Stage(StageId.SWITCH_HOP, 11, "Switch hop", "fabric between engine host and gateway",
          "network", StageGroup.NETWORK),
    Stage(StageId.NIC_TX, 12, "NIC transmit", "NIC transmit of response bytes", "network",
          StageGroup.NETWORK),
    Stage(StageId.ETHERNET_SERIALIZE, 13, "Ethernet serialization",
          "frame serialization, small-packet overhead", "network", StageGroup.NETWORK),
    Stage(StageId.RESPONSE_PATH, 14, "Response path", "gateway streaming the response back",
          "network", StageGroup.GATEWAY),
    Stage(StageId.CLIENT_DECODE, 15, "Client decoding",
          "client SDK shim (parse, detokenize)", "CPU", StageGroup.CLIENT),
)

STAGE_BY_ID: dict[StageId, Stage] = {stage.id: stage for stage in STAGES}
STAGE_IDS: tuple[StageId, ...] = tuple(stage.id for stage in STAGES)

# Stages 7 to 10 split the engine's measured in-model time; they never add time.
GPU_STAGES: tuple[StageId, ...] = (
    StageId.GPU_DISPATCH,
    StageId.HBM_LOAD,
    StageId.KERNEL_EXEC,
    StageId.NVLINK,
)
NETWORK_STAGES: tuple[StageId, ...] = tuple(
    stage.id for stage in STAGES if stage.group is StageGroup.NETWORK
)
# The response path: stages after the engine that carry bytes back to the client.
RESPONSE_PATH_STAGES: tuple[StageId, ...] = (*NETWORK_STAGES, StageId.RESPONSE_PATH)


# Attribute value -> member. Keys are the plain strings, so a value of any other type
# (a number, a tuple) finds nothing; hot loops call ``.get`` on these directly.
STAGE_BY_VALUE: dict[object, StageId] = {stage.value: stage for stage in StageId}
PHASE_BY_VALUE: dict[object, Phase] = {phase.value: phase for phase in Phase}
PROVENANCE_BY_VALUE: dict[object, Provenance] = {p.value: p for p in Provenance}
