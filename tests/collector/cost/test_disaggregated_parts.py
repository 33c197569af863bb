"""Each engine of a disaggregated request priced for what it ran: the prefill node's GPU
time paid by the prefills it ran, the decode node's by the decodes, one record with both."""

from __future__ import annotations

import math

import pytest

from testkit.fakes.clock import FakeClock
from tests.collector.test_disaggregated import one_record, vllm_pd_proxy_trace
from tokenpath.collector.cost.attributor import AttributorConfig, CostAttributor
from tokenpath.collector.cost.disaggregated_parts import (
    PartMerger,
    PartSplitter,
    split_parts,
)
from tokenpath.collector.cost.prices import load_price_sheet
from tokenpath.records import RequestRecord
from tokenpath.stages import GPU_STAGES, Phase, StageId

from .helpers import RecordingSink, engine_record

PRICES = load_price_sheet()


def price(records: list[RequestRecord]) -> tuple[RecordingSink, CostAttributor]:
    sink = RecordingSink()
    merger = PartMerger(sink)
    cost = CostAttributor(merger, PRICES, clock=FakeClock(),
                          config=AttributorConfig(tick_seconds=0))
    splitter = PartSplitter(cost, merger)
    for record in records:
        splitter.consume_record(record)
    splitter.shutdown()
    return sink, cost


def phase_dollars(record: RequestRecord, phase: Phase) -> float:
    return sum(record.stages[s].phases[phase].cost_dollars for s in GPU_STAGES
               if s in record.stages and phase in record.stages[s].phases)


def test_the_reported_request_pays_each_node_for_what_it_ran() -> None:
    sink, cost = price([one_record(vllm_pd_proxy_trace())])
    assert len(sink.records) == 1  # one record, not one per engine
    record = sink.records[0]
    assert record.record_id == record.trace_id
    assert (record.prefill_node, record.node) == ("prefill-0-node", "decode-0-node")
    ledger = cost.ledger
    assert set(ledger) == {"prefill-0-node", "decode-0-node"}
    prefill_dollars = phase_dollars(record, Phase.PREFILL)
    decode_dollars = phase_dollars(record, Phase.DECODE)
    assert prefill_dollars > 0 and decode_dollars > 0
    # the decode node's GPU dollars are this request's decode, the prefill node's its
    # prefill: the only request on each, so each node's attributed dollars
    assert ledger["decode-0-node"].attributed_dollars == pytest.approx(decode_dollars,
                                                                       rel=1e-9)
    assert ledger["prefill-0-node"].attributed_dollars == pytest.approx(prefill_dollars,
                                                                        rel=1e-9)
    assert record.gpu_cost_dollars == pytest.approx(prefill_dollars + decode_dollars)
    # 1.72 s of decode on the decode node, not on the prefill node
    decode_seconds = sum(record.stages[s].phases[Phase.DECODE].seconds for s in GPU_STAGES
                         if s in record.stages and Phase.DECODE in record.stages[s].phases)
    assert decode_seconds == pytest.approx(1.72)
    for node in ledger.values():  # conservation, per node
        assert math.isclose(node.node_dollars, node.attributed_dollars + node.idle_dollars,
                            rel_tol=1e-9, abs_tol=1e-12)
    # the KV transfer's bytes priced on the network stage it crossed
    transfer = record.stages[StageId.NIC_TX].phases[Phase.KV_TRANSFER]
    assert record.kv_transfer_bytes is not None
    assert transfer.cost_dollars == pytest.approx(
        record.kv_transfer_bytes * PRICES.network_dollars_per_byte, rel=1e-6)
    assert record.cost_dollars == pytest.approx(
        sum(t.cost_dollars for t in record.stages.values()))


def test_parts_carry_one_engine_each() -> None:
    record = one_record(vllm_pd_proxy_trace())
    parts = split_parts(record)
    assert parts is not None
    prefill, decode = parts
    assert (prefill.node, prefill.engine_id) == ("prefill-0-node", "prefill-0")
    assert (decode.node, decode.engine_id) == ("decode-0-node", "decode-0")
    assert prefill.decode_seconds == 0.0 and decode.prefill_seconds == 0.0
    assert all(Phase.DECODE not in t.phases for t in prefill.stages.values())
    assert set(decode.stages) <= set(GPU_STAGES)
    assert split_parts(engine_record(0, 1.0, 0.1, 0.5)) is None


def test_shared_nodes_are_paid_by_the_requests_they_served() -> None:
    """Disaggregated requests share a prefill node and a decode node with requests served
    whole on the decode node: each node's dollars are its requests' plus its idle."""
    records: list[RequestRecord] = []
    for i in range(6):
        record = one_record(vllm_pd_proxy_trace())
        shift = i * 0.4
        for name in ("start_unix", "end_unix", "prefill_start_unix", "decode_start_unix",
                     "engine_end_unix"):
            setattr(record, name, getattr(record, name) + shift)
        records.append(record)
    for i in range(4):
        records.append(engine_record(100 + i, 100.2 + 0.3 * i, 0.05, 1.0,
                                     node="decode-0-node"))
    sink, cost = price(records)
    assert len(sink.records) == 10
    disaggregated = [r for r in sink.records if r.prefill_node is not None]
    whole = [r for r in sink.records if r.prefill_node is None]
    ledger = cost.ledger
    prefill_paid = sum(phase_dollars(r, Phase.PREFILL) for r in disaggregated)
    assert ledger["prefill-0-node"].attributed_dollars == pytest.approx(prefill_paid,
                                                                        rel=1e-9)
    decode_paid = (sum(phase_dollars(r, Phase.DECODE) for r in disaggregated)
                   + sum(r.gpu_cost_dollars for r in whole))
    assert ledger["decode-0-node"].attributed_dollars == pytest.approx(decode_paid, rel=1e-9)
    for node in ledger.values():
        assert math.isclose(node.node_dollars, node.attributed_dollars + node.idle_dollars,
                            rel_tol=1e-9, abs_tol=1e-12)


def test_engines_on_one_node_keep_the_transfer_on_nvlink_and_share_its_gpus() -> None:
    spans = vllm_pd_proxy_trace()
    spans[4].resource["k8s.node.name"] = "prefill-0-node"  # the decode engine beside it
    sink, cost = price([one_record(spans)])
    record = sink.records[0]
    assert set(cost.ledger) == {"prefill-0-node"}
    nvlink = record.stages[StageId.NVLINK]
    assert nvlink.phases[Phase.KV_TRANSFER].seconds == pytest.approx(0.12)
    assert nvlink.phases[Phase.KV_TRANSFER].cost_dollars == 0.0  # the GPUs' slices paid
    assert StageId.NIC_TX not in record.stages
    node = cost.ledger["prefill-0-node"]
    assert node.attributed_dollars == pytest.approx(record.gpu_cost_dollars, rel=1e-9)
