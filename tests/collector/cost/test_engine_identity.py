"""Engine identity (tokenpath/identity.py): requests share GPU dollars only with requests
on the same GPUs, whatever the deployment sends to say which GPUs those are."""

from __future__ import annotations

import math
import time
from collections import defaultdict

from testkit.fakes.clock import FakeClock
from testkit.fakes.spans import new_trace_id, span
from tests.deploy.engine_traffic import engine_traffic
from tokenpath import attributes as A
from tokenpath.collector.assembler import AssembledTrace
from tokenpath.collector.cost.attributor import AttributorConfig, CostAttributor
from tokenpath.collector.cost.prices import load_price_sheet
from tokenpath.collector.limits import IngestLimits
from tokenpath.collector.mapping import map_trace
from tokenpath.collector.receivers.otlp_decode import decode_traces
from tokenpath.collector.spans import SPAN_KIND_SERVER
from tokenpath.identity import EngineIdentity, identity_from, pricing_resource
from tokenpath.records import RequestRecord

from .helpers import RecordingSink

PRICES = load_price_sheet()
VLLM = {A.GEN_AI_REQUEST_MODEL: "llama-3.1-8b", A.VLLM_USAGE_PROMPT_TOKENS: 100,
        A.VLLM_USAGE_COMPLETION_TOKENS: 20, A.VLLM_LATENCY_TIME_IN_QUEUE: 0.001,
        A.VLLM_LATENCY_TIME_IN_MODEL_PREFILL: 0.02, A.VLLM_LATENCY_TIME_IN_MODEL_DECODE: 0.3}


def _records() -> list[RequestRecord]:
    """The scale-out traffic's records, as the collector decodes and maps them."""
    traffic = engine_traffic(time.time())
    spans = decode_traces(traffic.request, IngestLimits()).spans
    by_trace: dict[str, list] = defaultdict(list)  # type: ignore[type-arg]
    for s in spans:
        by_trace[s.trace_id].append(s)
    records = [map_trace(AssembledTrace(tid, group, True, [])) for tid, group in
               by_trace.items()]
    return [r for r in records if r is not None]


def _price(records: list[RequestRecord]) -> dict[str, float]:
    sink = RecordingSink()
    cost = CostAttributor(sink, PRICES, clock=FakeClock(),
                          config=AttributorConfig(tick_seconds=0))
    for record in records:
        cost.consume_record(RequestRecord.from_json(record.to_json()))
    cost.shutdown()
    return {r.trace_id: r.gpu_cost_dollars for r in sink.records}


def test_engines_known_only_by_their_resource_price_as_if_alone() -> None:
    records = _records()
    by_unit: dict[str, list[RequestRecord]] = defaultdict(list)
    for record in records:
        by_unit[EngineIdentity(record.node, record.engine_id).pricing_unit].append(record)
    # two vLLM processes (service.instance.id only) and the demo's engine on its node
    assert len(by_unit) == 3
    vllm_units = [u for u, rs in by_unit.items() if rs[0].node is None]
    assert len(vllm_units) == 2
    mixed = _price(records)
    for unit_records in by_unit.values():
        alone = _price(unit_records)
        for trace_id, dollars in alone.items():
            assert dollars > 0
            assert math.isclose(mixed[trace_id], dollars, rel_tol=1e-6), trace_id


def test_the_engine_span_names_the_gpus_not_the_gateway() -> None:
    tid = new_trace_id()
    gateway = span(tid, "POST /v1/chat/completions", kind=SPAN_KIND_SERVER, start=0.0, end=1.0,
                   attributes={"http.route": "/v1/chat/completions"},
                   resource={A.HOST_NAME: "gateway-host", A.SERVICE_INSTANCE_ID: "gw-1"})
    engine = span(tid, A.VLLM_REQUEST_SPAN_NAME, parent=gateway.span_id, start=0.1, end=0.9,
                  attributes=VLLM,
                  resource={A.K8S_NODE_NAME: "gpu-node-3", A.K8S_POD_UID: "pod-uid-7",
                            A.SERVICE_INSTANCE_ID: "vllm-proc"})
    record = map_trace(AssembledTrace(tid, [gateway, engine], True, []))
    assert record is not None
    assert (record.node, record.engine_id) == ("gpu-node-3", "pod-uid-7")


def test_identity_precedence_is_by_key_then_layer() -> None:
    layers = [{A.SERVICE_INSTANCE_ID: "proc"}, {A.HOST_NAME: "host", A.K8S_POD_NAME: "pod"},
              {A.NODE: "explicit"}]
    identity = identity_from(layers)
    # tokenpath.node beats host.name though it is in a later layer; pod name beats the
    # process's instance id
    assert identity == EngineIdentity("explicit", "pod")
    assert identity.pricing_unit == "explicit"
    assert EngineIdentity(None, "proc").pricing_unit == "proc"
    assert pricing_resource("explicit", "pod") == {A.NODE: "explicit"}
    assert pricing_resource(None, "proc") == {A.ENGINE_ID: "proc"}


def test_two_engines_on_one_host_are_two_gpu_sets() -> None:
    """8 x TP=1 on one host: two of those engines busy at once each pay their own GPU,
    and the host's idle is its GPUs minus what they used."""
    sink = RecordingSink()
    cost = CostAttributor(sink, PRICES, clock=FakeClock(),
                          config=AttributorConfig(tick_seconds=0))
    per_second = PRICES.gpus[PRICES.default_gpu_type].dollars_per_second
    for index, engine in enumerate(("pod-a", "pod-b")):
        record = RequestRecord(
            trace_id=f"{index + 1:032x}", model="llama-3.1-8b", node="host-1",
            engine_id=engine, input_tokens=100, output_tokens=50, prefill_seconds=0.1,
            decode_seconds=0.9, prefill_start_unix=10.0, decode_start_unix=10.1,
            engine_end_unix=11.0)
        cost.consume_record(record)
    cost.shutdown()
    assert len(sink.records) == 2
    for record in sink.records:  # each alone on its GPU for the whole second
        assert math.isclose(record.gpu_cost_dollars, per_second, rel_tol=1e-9)
        assert record.gpu_inventory is False
    assert cost.ledger["host-1"].gpu_count == 2
    assert sink.idle_dollars == 0.0


def test_models_on_one_engine_share_its_gpus() -> None:
    """Two models (LoRA adapters, aliases) served by one TP=1 engine at once: one GPU."""
    sink = RecordingSink()
    cost = CostAttributor(sink, PRICES, clock=FakeClock(),
                          config=AttributorConfig(tick_seconds=0))
    per_second = PRICES.gpus[PRICES.default_gpu_type].dollars_per_second
    for index, model in enumerate(("llama-3.1-8b", "llama-3.1-8b-lora-a")):
        cost.consume_record(RequestRecord(
            trace_id=f"{index + 1:032x}", model=model, engine_id="pod-a", input_tokens=100,
            output_tokens=50, prefill_seconds=0.1, decode_seconds=9.9,
            prefill_start_unix=0.0, decode_start_unix=0.1, engine_end_unix=10.0))
    cost.shutdown()
    assert math.isclose(sum(r.gpu_cost_dollars for r in sink.records), 10 * per_second,
                        rel_tol=1e-9)
    assert sink.idle_dollars == 0.0


def test_a_restarted_engine_stops_costing_idle_and_memory() -> None:
    """A vLLM process replaced by another (a new service.instance.id): the old one's GPU
    stops counting towards idle after the retire time, and its unit is dropped."""
    sink = RecordingSink()
    clock = FakeClock(0.0)
    config = AttributorConfig(tick_seconds=0, engine_retire_seconds=60,
                              min_delay_seconds=0, max_delay_seconds=0)
    cost = CostAttributor(sink, PRICES, clock=clock, config=config)
    per_second = PRICES.gpus[PRICES.default_gpu_type].dollars_per_second

    def request(index: int, engine: str, start: float) -> RequestRecord:
        return RequestRecord(
            trace_id=f"{index + 1:032x}", model="llama-3.1-8b", engine_id=engine,
            input_tokens=100, output_tokens=50, prefill_seconds=0.1, decode_seconds=0.9,
            prefill_start_unix=start, decode_start_unix=start + 0.1, engine_end_unix=start + 1)

    clock.now = 1.0
    cost.consume_record(request(0, "vllm-old", 0.0))
    for minute in range(1, 30):  # a day compressed: the old process never comes back
        clock.now = minute * 60.0
        cost.tick()
    assert "vllm-old" not in cost.ledger
    # it cost idle only for its retire time after its last request (61 s in all)
    assert sink.idle_dollars <= 61 * per_second * (1 + 1e-9)
    cost.consume_record(request(1, "vllm-new", clock.now))
    cost.shutdown()
    assert [r.engine_id for r in sink.records] == ["vllm-old", "vllm-new"]
