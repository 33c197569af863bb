"""Each engine of a disaggregated request priced for what it ran.

A disaggregated record (collector/disaggregated.py) ran its prefill on one engine's GPUs
and its decode on another's. The attributor apportions each pricing unit's slices among
the intervals active on it, so the record enters it as two *parts*:

- the prefill part, on the prefill engine's unit (``prefill_node``, else
  ``prefill_engine_id``): its prefill interval only (prefill start to prefill end, no
  decode), its prompt, its CPU and network stages (the KV transfer's bytes among them)
  and the GPU stages' prefill shares;
- the decode part, on the decode engine's unit: its decode interval only (the decode
  engine's first token to its end, a zero-length prefill), the GPU stages' decode shares,
  no CPU or network stage (priced once, on the prefill part).

:class:`PartSplitter` sits in front of the attributor and hands it the parts (record ids
``<record id>/prefill`` and ``<record id>/decode``); :class:`PartMerger` sits behind it
and, once both parts are priced, hands on the one record with both parts' dollars
(:func:`merge_parts`): each GPU stage's ``prefill`` phase share was paid by the prefill
engine's GPUs, its ``decode`` share by the decode engine's, and the record's GPU dollars
are their sum. Each node's busy time is thereby paid by the requests it served: the
prefill node's slices by the prefills it ran, the decode node's by the decodes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tokenpath.collector.cost.sources import SourceProgress
from tokenpath.collector.interfaces import ForwardedConsumer, RecordSink
from tokenpath.records import IdleCost, PhaseShare, RequestRecord, StageTiming
from tokenpath.stage_members import DECODE, KV_TRANSFER, NVLINK, PREFILL
from tokenpath.stages import GPU_STAGES, PROVENANCE_RANK, Phase, StageId

PREFILL_PART_SUFFIX = "/prefill"
DECODE_PART_SUFFIX = "/decode"
# how long a priced part waits for the other before it goes on alone (counted)
DEFAULT_PART_WAIT_SECONDS = 900.0
PART_TICK_SECONDS = 5.0


def is_disaggregated(record: RequestRecord) -> bool:
    """Whether the mapper found two engines (prefill and decode) for the record."""
    return record.kv_transfer_source is not None


def is_part(record: RequestRecord) -> bool:
    """Whether ``record`` is one part of a disaggregated record (never split again)."""
    return record.record_id.endswith((PREFILL_PART_SUFFIX, DECODE_PART_SUFFIX))


def _copy(timing: StageTiming, phase: Phase | None = None) -> StageTiming | None:
    """A copy of ``timing``; with ``phase``, only that phase's share (None: it has none)."""
    if phase is None:
        phases = {p: PhaseShare(s.seconds, s.cost_dollars) for p, s in timing.phases.items()}
        return StageTiming(timing.stage, timing.seconds, timing.provenance,
                           timing.cost_dollars, phases)
    share = timing.phases.get(phase)
    if share is None:
        return None
    return StageTiming(timing.stage, share.seconds, timing.provenance, share.cost_dollars,
                       {phase: PhaseShare(share.seconds, share.cost_dollars)})


def _part(record: RequestRecord, suffix: str, node: str | None, engine_id: str | None,
          start: float, end: float) -> RequestRecord:
    return RequestRecord(
        trace_id=record.trace_id, record_id=record.record_id + suffix, model=record.model,
        request_id=record.request_id, status=record.status, node=node, pool=record.pool,
        tenant=record.tenant, engine=record.engine, engine_id=engine_id,
        gpu_type=record.gpu_type, tensor_parallel=record.tensor_parallel,
        simulated=record.simulated, start_unix=start, end_unix=end,
        input_tokens=record.input_tokens, complete=record.complete,
        kv_transfer_tokens=record.kv_transfer_tokens,
        kv_transfer_bytes=record.kv_transfer_bytes,
        kv_transfer_source=record.kv_transfer_source)


def split_parts(record: RequestRecord) -> tuple[RequestRecord, RequestRecord] | None:
    """The prefill and decode parts of a disaggregated record; None when it is not one or
    has no engine timeline to apportion."""
    ps, ds, end = record.prefill_start_unix, record.decode_start_unix, record.engine_end_unix
    if (not is_disaggregated(record) or is_part(record) or ps is None or ds is None
            or end is None):
        return None
    prefill_end = min(ds, ps + (record.prefill_seconds or 0.0))
    prefill = _part(record, PREFILL_PART_SUFFIX, record.prefill_node,
                    record.prefill_engine_id, record.start_unix, ds)
    prefill.cache_read_tokens = record.cache_read_tokens
    prefill.output_tokens = min(1, record.output_tokens)
    prefill.prefill_seconds, prefill.decode_seconds = prefill_end - ps, 0.0
    prefill.prefill_start_unix = ps
    prefill.decode_start_unix = prefill.engine_end_unix = prefill_end
    prefill.response_bytes = record.response_bytes
    prefill.prefix_fingerprints = record.prefix_fingerprints
    prefill.prefix_block_tokens = record.prefix_block_tokens
    # where the priced prefill part goes when another collector prices the decode
    prefill.decode_node, prefill.decode_engine_id = record.decode_node, record.decode_engine_id
    decode = _part(record, DECODE_PART_SUFFIX, record.decode_node, record.decode_engine_id,
                   ds, record.end_unix)
    decode.cache_read_tokens = record.input_tokens  # its prompt's KV came over the wire
    decode.output_tokens = record.output_tokens
    decode.prefill_seconds, decode.decode_seconds = 0.0, end - ds
    decode.prefill_start_unix = decode.decode_start_unix = ds
    decode.engine_end_unix = end
    for stage, timing in record.stages.items():
        if stage in GPU_STAGES:
            for part, phase in ((prefill, PREFILL), (decode, DECODE)):
                share = _copy(timing, phase)
                if share is not None:
                    part.stages[stage] = share
        else:
            copied = _copy(timing)
            assert copied is not None
            prefill.stages[stage] = copied
    return prefill, decode


def _weakest(a: StageTiming, b: StageTiming) -> StageTiming:
    return a if PROVENANCE_RANK[a.provenance] >= PROVENANCE_RANK[b.provenance] else b


def merge_parts(record: RequestRecord, prefill: RequestRecord,
                decode: RequestRecord) -> RequestRecord:
    """``record`` (in place; returned) with its priced parts' dollars: the prefill part's
    CPU, network and prefill GPU shares, the decode part's decode GPU shares."""
    kv_on_nvlink = record.stages.get(NVLINK)
    kv_share = None if kv_on_nvlink is None else kv_on_nvlink.phases.get(KV_TRANSFER)
    stages: dict[StageId, StageTiming] = {}
    for stage, timing in prefill.stages.items():
        if stage not in GPU_STAGES:
            stages[stage] = timing
    for stage in GPU_STAGES:
        parts = [t for t in (prefill.stages.get(stage), decode.stages.get(stage))
                 if t is not None]
        if not parts:
            continue
        merged = StageTiming(stage, 0.0, parts[0].provenance if len(parts) == 1
                             else _weakest(parts[0], parts[1]).provenance)
        for part in parts:
            merged.seconds += part.seconds
            merged.cost_dollars += part.cost_dollars
            for phase, share in part.phases.items():
                merged.phases[phase] = PhaseShare(share.seconds, share.cost_dollars)
        stages[stage] = merged
    if kv_on_nvlink is not None and kv_share is not None:
        # the transfer inside the node: time on its GPUs' links, paid by their slices above
        nvlink = stages.get(NVLINK)
        if nvlink is None:
            nvlink = stages[NVLINK] = StageTiming(NVLINK, 0.0, kv_on_nvlink.provenance)
        nvlink.seconds += kv_share.seconds
        nvlink.phases[KV_TRANSFER] = PhaseShare(kv_share.seconds, 0.0)
    record.stages = stages
    record.cost_dollars = sum(t.cost_dollars for t in stages.values())
    record.naive_cost_dollars = prefill.naive_cost_dollars + decode.naive_cost_dollars
    record.cache_miss_waste_dollars = prefill.cache_miss_waste_dollars
    record.miss_tokens, record.miss_dollars = prefill.miss_tokens, prefill.miss_dollars
    record.energy_joules = prefill.energy_joules + decode.energy_joules
    provenances = {prefill.energy_provenance, decode.energy_provenance} - {None}
    record.energy_provenance = (None if not provenances else next(iter(provenances))
                                if len(provenances) == 1 else "modeled")
    inventory = {prefill.gpu_inventory, decode.gpu_inventory}
    record.gpu_inventory = (None if None in inventory else all(inventory))
    return record


class PartMerger:
    """RecordSink behind the attributor: a disaggregated record goes on once both its
    priced parts came back; every other record and the idle cost pass.

    Sharded (docs/cost-model.md): the prefill part is priced by its own unit's collector,
    which hands it on priced (``forward_part``: the forwarder, to the decode unit's
    collector); the decode unit's collector waits for it (:meth:`consume_priced_part`). A
    part that comes before its record is expected is held; what waits longer than
    ``wait_seconds`` goes on alone, counted (``unmatched``)."""

    def __init__(self, downstream: RecordSink,
                 forward_part: Callable[[RequestRecord], None] | None = None,
                 wait_seconds: float = DEFAULT_PART_WAIT_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._downstream = downstream
        self._forward_part = forward_part
        self._wait_seconds = wait_seconds
        self._clock = clock
        # part record id -> (the record, its parts priced so far by suffix, since when)
        self._waiting: dict[str, tuple[RequestRecord, dict[str, RequestRecord], float]] = {}
        self._orphans: dict[str, tuple[RequestRecord, float]] = {}  # priced, not expected
        self.unmatched = 0

    @property
    def held(self) -> int:
        return len(self._waiting) // 2 + len(self._orphans)

    @property
    def tick_seconds(self) -> float:
        return PART_TICK_SECONDS

    def expect(self, record: RequestRecord, prefill: RequestRecord,
               decode: RequestRecord) -> None:
        entry: tuple[RequestRecord, dict[str, RequestRecord], float] = (record, {},
                                                                        self._clock())
        self._waiting[prefill.record_id] = entry
        self._waiting[decode.record_id] = entry
        for part_id in (prefill.record_id, decode.record_id):
            orphan = self._orphans.pop(part_id, None)
            if orphan is not None:
                self._take(orphan[0])

    def consume_record(self, record: RequestRecord) -> None:
        if record.record_id in self._waiting:
            self._take(record)
        elif self._forward_part is not None and record.record_id.endswith(
                PREFILL_PART_SUFFIX) and is_disaggregated(record):
            self._forward_part(record)  # its decode is priced on another collector
        elif is_part(record) and is_disaggregated(record):
            self._orphans[record.record_id] = (record, self._clock())
        else:
            self._downstream.consume_record(record)

    def consume_priced_part(self, part: RequestRecord) -> None:
        """A part another collector priced, for a record whose decode is priced here."""
        if part.record_id in self._waiting:
            self._take(part)
        else:
            self._orphans[part.record_id] = (part, self._clock())

    def _take(self, part: RequestRecord) -> None:
        entry = self._waiting.pop(part.record_id, None)
        if entry is None:
            return
        original, priced, _ = entry
        suffix = (PREFILL_PART_SUFFIX if part.record_id.endswith(PREFILL_PART_SUFFIX)
                  else DECODE_PART_SUFFIX)
        priced[suffix] = part
        if len(priced) == 2:
            self._downstream.consume_record(merge_parts(
                original, priced[PREFILL_PART_SUFFIX], priced[DECODE_PART_SUFFIX]))

    def tick(self) -> None:
        """Parts waiting past ``wait_seconds`` go on alone (their record ids say which)."""
        horizon = self._clock() - self._wait_seconds
        for part_id, (part, since) in list(self._orphans.items()):
            if since < horizon:
                del self._orphans[part_id]
                self._give_up([part])
        gone: list[str] = [i for i, (_, _, since) in self._waiting.items() if since < horizon]
        for part_id in gone:
            entry = self._waiting.pop(part_id, None)
            if entry is not None and part_id.endswith(DECODE_PART_SUFFIX):
                self._give_up(list(entry[1].values()))

    def _give_up(self, parts: list[RequestRecord]) -> None:
        self.unmatched += 1
        for part in parts:
            self._downstream.consume_record(part)

    def consume_idle_cost(self, idle: IdleCost) -> None:
        self._downstream.consume_idle_cost(idle)

    def shutdown(self) -> None:
        self._wait_seconds = -1.0
        self.tick()  # what still waits goes on as it is
        self._downstream.shutdown()


class ForwardedParts:
    """The pipeline's consumer of forwarded records in front of the attributor: a
    forwarded disaggregated record is priced here as its decode part (its prefill part
    was forwarded to the prefill engine's unit, and comes back priced), every other
    forwarded record, progress message and priced part goes where it belongs."""

    def __init__(self, attributor: ForwardedConsumer, merger: PartMerger) -> None:
        self._attributor = attributor
        self._merger = merger

    def consume_forwarded(self, record: RequestRecord, source: str | None) -> None:
        parts = split_parts(record)
        if parts is None:
            self._attributor.consume_forwarded(record, source)
            return
        prefill, decode = parts
        self._merger.expect(record, prefill, decode)
        self._attributor.consume_forwarded(decode, source)

    def consume_progress(self, progress: SourceProgress) -> None:
        self._attributor.consume_progress(progress)

    def consume_priced_part(self, part: RequestRecord) -> None:
        self._merger.consume_priced_part(part)


class PartSplitter:
    """RecordSink in front of the attributor: a disaggregated record goes in as its two
    parts (the merger behind the attributor is told to expect them); every other record
    goes in as it is."""

    def __init__(self, attributor: RecordSink, merger: PartMerger) -> None:
        self._attributor = attributor
        self._merger = merger

    def consume_record(self, record: RequestRecord) -> None:
        parts = split_parts(record)
        if parts is None:
            self._attributor.consume_record(record)
            return
        prefill, decode = parts
        self._merger.expect(record, prefill, decode)
        self._attributor.consume_record(prefill)
        self._attributor.consume_record(decode)

    def consume_idle_cost(self, idle: IdleCost) -> None:
        self._attributor.consume_idle_cost(idle)

    def shutdown(self) -> None:
        self._attributor.shutdown()
