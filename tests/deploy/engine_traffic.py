"""Realistic engine traffic for the pricing tests: overlapping continuous-batching
timelines at real batch sizes, exported as the engines themselves export them.

Each engine's timeline comes from the step-level simulator (collector/cost/stepsim.py:
Poisson arrivals, continuous batching, chunked prefill) and is turned into spans with the
real OpenTelemetry SDK and encoded with the real OTLP encoder:

- vLLM engines: vLLM's own ``llm_request`` span and attributes, each process's resource
  carrying nothing but ``service.name`` and a distinct ``service.instance.id`` (no
  ``tokenpath.node``), half of the requests under a gateway's HTTP server span from
  another host;
- the demo's engine: tokenpath's engine hooks (EngineRequestTrace), as the reference
  serving path emits them, with ``tokenpath.node`` and measured gpu_dispatch per phase.

Timelines are shifted to end just before ``now`` so collectors price them as live
traffic. The numbers are simulated."""

from __future__ import annotations

import random
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tokenpath import attributes as A
from tokenpath.collector.cost.prices import load_price_sheet
from tokenpath.collector.cost.stepsim import random_workload, simulate
from tokenpath.instrumentation.engine_trace import EngineIdentity, EngineRequestTrace
from tokenpath.records import RequestRecord
from tokenpath.roofline import roofline_for
from tokenpath.stages import Phase, StageId

MODEL = "llama-3.1-8b"
GPU = "H100-SXM"
MAX_BATCH = 96


class _ChosenIds(IdGenerator):
    """Trace ids chosen by the caller (the simulator's), span ids random."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self.next_trace_id = 0

    def generate_span_id(self) -> int:
        return self._rng.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self.next_trace_id


@dataclass
class _Exporter:
    provider: TracerProvider
    memory: InMemorySpanExporter
    ids: _ChosenIds

    @classmethod
    def make(cls, resource: dict[str, str], rng: random.Random) -> _Exporter:
        ids = _ChosenIds(rng)
        provider = TracerProvider(resource=Resource.create(resource), id_generator=ids)
        memory = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        return cls(provider, memory, ids)

    def spans(self) -> list[ReadableSpan]:
        return list(self.memory.get_finished_spans())


def _ns(t: float) -> int:
    return int(t * 1e9)


def _timeline(seed: int, count: int, rps: float) -> list[RequestRecord]:
    roofline = roofline_for(GPU, MODEL)
    price = load_price_sheet().gpus[GPU].dollars_per_second
    result = simulate(random_workload(seed, count, rps), roofline, price, model=MODEL,
                      max_batch=MAX_BATCH, prefill_chunk_tokens=2048, record_dispatch=True)
    return result.records


def _shift(records: list[RequestRecord], offset: float) -> None:
    for record in records:
        for name in ("start_unix", "end_unix"):
            setattr(record, name, getattr(record, name) + offset)
        for name in ("prefill_start_unix", "decode_start_unix", "engine_end_unix"):
            value = getattr(record, name)
            setattr(record, name, None if value is None else value + offset)


def _arrival(record: RequestRecord) -> float:
    assert record.prefill_start_unix is not None
    return record.prefill_start_unix - (record.queue_seconds or 0.0)


def _gateway_span(gateway: _Exporter, record: RequestRecord) -> trace.Span:
    gateway.ids.next_trace_id = int(record.trace_id, 16)
    assert record.engine_end_unix is not None
    return gateway.provider.get_tracer("gateway").start_span(
        "POST /v1/chat/completions", kind=SpanKind.SERVER,
        start_time=_ns(_arrival(record) - 0.004),
        attributes={"http.request.method": "POST", "http.route": "/v1/chat/completions",
                    "http.response.status_code": 200})


def _vllm_span(engine: _Exporter, record: RequestRecord, parent: trace.Span | None,
               model: str = MODEL) -> None:
    ps, ds, end = record.prefill_start_unix, record.decode_start_unix, record.engine_end_unix
    assert ps is not None and ds is not None and end is not None
    arrival = _arrival(record)
    engine.ids.next_trace_id = int(record.trace_id, 16)
    context = trace.set_span_in_context(parent) if parent is not None else None
    span = engine.provider.get_tracer("vllm").start_span(
        A.VLLM_REQUEST_SPAN_NAME, context=context, kind=SpanKind.SERVER,
        start_time=_ns(arrival), attributes={
            A.GEN_AI_REQUEST_MODEL: model,
            A.GEN_AI_REQUEST_ID: f"cmpl-{record.trace_id[:16]}",
            A.VLLM_USAGE_PROMPT_TOKENS: record.input_tokens,
            A.VLLM_USAGE_COMPLETION_TOKENS: record.output_tokens,
            A.VLLM_LATENCY_TIME_IN_QUEUE: ps - arrival,
            A.VLLM_LATENCY_TIME_TO_FIRST_TOKEN: ds - arrival,
            A.VLLM_LATENCY_E2E: end - arrival,
            A.VLLM_LATENCY_TIME_IN_MODEL_PREFILL: ds - ps,
            A.VLLM_LATENCY_TIME_IN_MODEL_DECODE: end - ds,
        })
    span.end(end_time=_ns(end))


def _demo_span(engine: _Exporter, record: RequestRecord, node: str,
               parent: trace.Span) -> None:
    ps, ds, end = record.prefill_start_unix, record.decode_start_unix, record.engine_end_unix
    assert ps is not None and ds is not None and end is not None
    identity = EngineIdentity(model=MODEL, engine="simulated", replica="0", node=node,
                              pool="sim", gpu_type=GPU, simulated=True)
    headers: dict[str, str] = {}  # the gateway's traceparent, as it forwards it
    TraceContextTextMapPropagator().inject(headers, context=trace.set_span_in_context(parent))
    hooks = EngineRequestTrace(engine.provider.get_tracer("engine"), identity,
                               f"req-{record.trace_id[:16]}", record.input_tokens,
                               record.output_tokens, trace_headers=headers,
                               arrival=_arrival(record))
    hooks.scheduled(ps)
    hooks.kv_lookup(0.0002, record.cache_read_tokens)
    dispatch = record.stages.get(StageId.GPU_DISPATCH)
    for phase in (Phase.PREFILL, Phase.DECODE):
        share = dispatch.phases.get(phase) if dispatch is not None else None
        seconds = (ds - ps) if phase is Phase.PREFILL else (end - ds)
        hooks.step(phase, seconds, share.seconds if share is not None else 0.0)
    hooks.first_token(ds)
    hooks.finish(end, record.output_tokens, "stop")


@dataclass
class EngineTraffic:
    request: ExportTraceServiceRequest
    trace_ids: list[str]
    window: tuple[float, float]  # first engine start, last engine end (unix seconds)
    engines: int


def engine_traffic(now: float, per_engine: int = 100, rps: float = 30.0,
                   seed: int = 11, node: str = "gpu-node-1") -> EngineTraffic:
    """Two vLLM engines (resource identity only, ``vllm-SEED-0`` and ``-1``) and one demo
    engine on ``node``."""
    rng = random.Random(seed)
    timelines = [_timeline(seed + i, per_engine, rps) for i in range(3)]
    for records in timelines:  # the simulator numbers its traces: random ids, as SDKs make
        for record in records:
            record.trace_id = rng.randbytes(16).hex()
    last = max(r.engine_end_unix or 0.0 for t in timelines for r in t)
    for records in timelines:
        _shift(records, now - 1.0 - last)
    gateway = _Exporter.make({"service.name": "gateway", A.HOST_NAME: "gateway-host-1"}, rng)
    exporters: list[_Exporter] = []
    for index, records in enumerate(timelines):
        if index < 2:
            engine = _Exporter.make({"service.name": "vllm",
                                     A.SERVICE_INSTANCE_ID: f"vllm-{seed}-{index}"}, rng)
            for n, record in enumerate(records):
                parent = _gateway_span(gateway, record) if n % 2 == 0 else None
                _vllm_span(engine, record, parent)
                if parent is not None:
                    parent.end(end_time=_ns((record.engine_end_unix or 0.0) + 0.003))
        else:
            engine = _Exporter.make({"service.name": "tokenpath-reference"}, rng)
            for record in records:
                parent = _gateway_span(gateway, record)
                _demo_span(engine, record, node, parent)
                parent.end(end_time=_ns((record.engine_end_unix or 0.0) + 0.003))
        exporters.append(engine)
    spans = [s for e in (gateway, *exporters) for s in e.spans()]
    ids = [r.trace_id for t in timelines for r in t]
    window = (min(r.prefill_start_unix or 0.0 for t in timelines for r in t),
              max(r.engine_end_unix or 0.0 for t in timelines for r in t))
    return EngineTraffic(encode_spans(spans), ids, window, len(timelines))


def burst_traffic(now: float, count: int, seed: int = 5) -> ExportTraceServiceRequest:
    """``count`` requests on one vLLM engine, all in flight together: scheduled within
    two seconds, decoding for about ten, done a second before ``now``."""
    rng = random.Random(seed)
    engine = _Exporter.make({"service.name": "vllm", A.SERVICE_INSTANCE_ID: "vllm-burst"},
                            rng)
    for i in range(count):
        start = now - 13.0 + 2.0 * i / count
        decode_start = start + rng.uniform(0.05, 0.3)
        end = now - 1.0 - rng.uniform(0.0, 0.5)
        record = RequestRecord(
            trace_id=rng.randbytes(16).hex(), model=MODEL, input_tokens=rng.randint(64, 4096),
            output_tokens=rng.randint(100, 600), queue_seconds=0.01,
            prefill_start_unix=start, decode_start_unix=decode_start, engine_end_unix=end)
        _vllm_span(engine, record, None)
    return encode_spans(engine.spans())


def lora_traffic(now: float, count: int, seed: int = 23) -> EngineTraffic:
    """``count`` requests on one vLLM engine, each on a model of its own (LoRA adapters are
    served so: the adapter is the request's model), overlapping: scheduled over ten
    seconds, decoding for two to eight, the last done a second before ``now``."""
    rng = random.Random(seed)
    instance = f"vllm-lora-{seed}"
    engine = _Exporter.make({"service.name": "vllm", A.SERVICE_INSTANCE_ID: instance}, rng)
    records = []
    for i in range(count):
        start = now - 19.0 + 10.0 * i / count
        decode_start = start + rng.uniform(0.05, 0.3)
        end = decode_start + rng.uniform(2.0, 8.0)
        record = RequestRecord(
            trace_id=rng.randbytes(16).hex(), model=f"{MODEL}-adapter-{i}",
            input_tokens=rng.randint(64, 2048), output_tokens=rng.randint(50, 400),
            queue_seconds=0.01, prefill_start_unix=start, decode_start_unix=decode_start,
            engine_end_unix=end)
        records.append(record)
    for record in records:
        _vllm_span(engine, record, None, model=record.model)
    window = (min(r.prefill_start_unix or 0.0 for r in records),
              max(r.engine_end_unix or 0.0 for r in records))
    return EngineTraffic(encode_spans(engine.spans()), [r.trace_id for r in records],
                         window, 1)


def peak_in_flight(records: list[RequestRecord]) -> int:
    """The most requests on their engines at once (prefill start to engine end)."""
    events = sorted([(r.prefill_start_unix or 0.0, 1) for r in records]
                    + [(r.engine_end_unix or 0.0, -1) for r in records])
    peak = running = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def pd_traffic(now: float, nodes: list[tuple[str, str]], per_pair: int = 60,
               rps: float = 20.0, seed: int = 17) -> EngineTraffic:
    """Disaggregated serving in the shape of vLLM's P/D proxy: a pair of a prefill engine
    and a decode engine on the nodes named by each of ``nodes`` (prefill node, decode
    node). Each request is a gateway SERVER span, the proxy's two CLIENT
    calls, the prefill engine's ``llm_request`` (one output token) and the decode engine's
    (same request id; its queue wait the KV's arrival), its times from the step simulator:
    the prefills overlap on the prefill engine, the decodes on the decode engine."""
    rng = random.Random(seed)
    gateway = _Exporter.make({"service.name": "gateway", A.HOST_NAME: "gateway-host-1"}, rng)
    tracer = gateway.provider.get_tracer("proxy")
    timelines = [_timeline(seed + i, per_pair, rps) for i in range(len(nodes))]
    for records in timelines:
        for record in records:
            record.trace_id = rng.randbytes(16).hex()
    last = max(r.engine_end_unix or 0.0 for t in timelines for r in t)
    exporters: list[_Exporter] = []
    for index, records in enumerate(timelines):
        _shift(records, now - 1.0 - last)
        engines = {role: _Exporter.make({
            "service.name": "vllm", A.SERVICE_INSTANCE_ID: f"{node}-vllm",
            "k8s.node.name": node}, rng)
            for role, node in zip(("prefill", "decode"), nodes[index], strict=True)}
        exporters.extend(engines.values())
        for record in records:
            ps, ds, end = record.prefill_start_unix, record.decode_start_unix, \
                record.engine_end_unix
            assert ps is not None and ds is not None and end is not None
            arrival = _arrival(record)
            transfer = 0.002 + record.input_tokens * 2e-6  # the KV's way over the network
            root = _gateway_span(gateway, record)
            context = trace.set_span_in_context(root)
            request_id = f"cmpl-{record.trace_id[:16]}"
            # the decode engine schedules the request once its KV arrived, computes the
            # prompt's last token and decodes: it ends after the prefill engine did, a
            # one-token answer included
            end = max(end, ds + transfer + 0.001)
            calls = (("prefill", arrival, ds, 1, ps - arrival, ds - ps, 0.0),
                     ("decode", ds, end, record.output_tokens, transfer, 0.0005,
                      end - ds - transfer - 0.0005))
            for role, start, stop, output, queue, prefill, decode in calls:
                gateway.ids.next_trace_id = int(record.trace_id, 16)
                client = tracer.start_span(f"POST {role}", context=context,
                                           kind=SpanKind.CLIENT, start_time=_ns(start))
                engine = engines[role]
                engine.ids.next_trace_id = int(record.trace_id, 16)
                span = engine.provider.get_tracer("vllm").start_span(
                    A.VLLM_REQUEST_SPAN_NAME, context=trace.set_span_in_context(client),
                    kind=SpanKind.SERVER, start_time=_ns(start), attributes={
                        A.GEN_AI_REQUEST_MODEL: MODEL, A.GEN_AI_REQUEST_ID: request_id,
                        A.VLLM_USAGE_PROMPT_TOKENS: record.input_tokens,
                        A.VLLM_USAGE_COMPLETION_TOKENS: output,
                        A.VLLM_LATENCY_TIME_IN_QUEUE: queue,
                        A.VLLM_LATENCY_TIME_IN_MODEL_PREFILL: prefill,
                        A.VLLM_LATENCY_TIME_IN_MODEL_DECODE: max(0.0, decode)})
                span.end(end_time=_ns(stop))
                client.end(end_time=_ns(stop + 0.0005))
            root.end(end_time=_ns(end + 0.003))
    spans = [s for e in (gateway, *exporters) for s in e.spans()]
    ids = [r.trace_id for t in timelines for r in t]
    window = (min(r.prefill_start_unix or 0.0 for t in timelines for r in t),
              max(r.engine_end_unix or 0.0 for t in timelines for r in t))
    return EngineTraffic(encode_spans(spans), ids, window, 2 * len(nodes))
