"""Network stages priced by the bytes they moved: the response, and a disaggregated
request's KV transfer on its own phase."""

from __future__ import annotations

import pytest

from testkit.fakes.spans import new_trace_id
from tokenpath.collector.assembler import AssembledTrace
from tokenpath.collector.cost.stage_cost import has_kv_transfer, land_cpu_and_network_cost
from tokenpath.collector.mapping import map_calls
from tokenpath.records import PhaseShare, RequestRecord, StageTiming
from tokenpath.stages import Phase, Provenance, StageId

PER_BYTE = 1e-10
KV_BYTES_PER_TOKEN = 131_072.0  # Llama-3.1-8B, BF16: 2 x 32 layers x 8 heads x 128 x 2 B


def _network_record() -> RequestRecord:
    record = RequestRecord(trace_id=new_trace_id(), input_tokens=900, response_bytes=20_000)
    nic = StageTiming(StageId.NIC_TX, 0.05, Provenance.MEASURED)
    nic.phases[Phase.KV_TRANSFER] = PhaseShare(0.04)  # 0.04 s of KV, 0.01 s of response
    record.stages[StageId.NIC_TX] = nic
    record.stages[StageId.SWITCH_HOP] = StageTiming(StageId.SWITCH_HOP, 0.01,
                                                    Provenance.DERIVED)
    return record


def test_the_kv_transfer_is_priced_by_the_prompts_kv_bytes_on_its_phase() -> None:
    record = _network_record()
    assert has_kv_transfer(record)
    land_cpu_and_network_cost(record, 0.0, PER_BYTE, KV_BYTES_PER_TOKEN)
    nic, switch = record.stages[StageId.NIC_TX], record.stages[StageId.SWITCH_HOP]
    kv = nic.phases[Phase.KV_TRANSFER].cost_dollars
    assert kv == pytest.approx(900 * KV_BYTES_PER_TOKEN * PER_BYTE)
    # the response's bytes split over the response's seconds only (0.01 s and 0.01 s)
    response = 20_000 * PER_BYTE
    assert nic.cost_dollars - kv == pytest.approx(response / 2)
    assert switch.cost_dollars == pytest.approx(response / 2)


def test_without_a_kv_transfer_the_response_bytes_spread_as_before() -> None:
    record = _network_record()
    del record.stages[StageId.NIC_TX].phases[Phase.KV_TRANSFER]
    assert not has_kv_transfer(record)
    land_cpu_and_network_cost(record, 0.0, PER_BYTE)
    nic, switch = record.stages[StageId.NIC_TX], record.stages[StageId.SWITCH_HOP]
    assert nic.cost_dollars == pytest.approx(20_000 * PER_BYTE * 0.05 / 0.06)
    assert switch.cost_dollars == pytest.approx(20_000 * PER_BYTE * 0.01 / 0.06)


def test_sglangs_kv_transfer_slice_times_nic_tx_in_the_kv_transfer_phase() -> None:
    """FIXTURE (SGLang cannot run here): a P/D request's prefill root with its
    prefill_transfer_kv_cache slice (srt/observability/req_time_stats.py) and the decode
    root."""
    from testkit.fakes.spans import span
    from tests.collector.test_stack_vocabularies import _sglang_root

    tid = new_trace_id()
    prefill = _sglang_root(tid, "prefill", 10.0, 10.4, 0.25, 0.0)
    transfer = span(tid, "prefill_transfer_kv_cache", parent=prefill.span_id, start=10.26,
                    end=10.38)
    decode = _sglang_root(tid, "decode", 10.1, 11.2, 0.0, 0.9)
    (record,) = map_calls(AssembledTrace(tid, [prefill, transfer, decode], True))
    nic = record.stages[StageId.NIC_TX]
    assert nic.phases[Phase.KV_TRANSFER].seconds == pytest.approx(0.12)
    assert nic.provenance is Provenance.MEASURED
    land_cpu_and_network_cost(record, 0.0, PER_BYTE, KV_BYTES_PER_TOKEN)
    assert nic.phases[Phase.KV_TRANSFER].cost_dollars == pytest.approx(
        900 * KV_BYTES_PER_TOKEN * PER_BYTE)
