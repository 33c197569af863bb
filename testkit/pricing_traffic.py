"""Request records for the pricing scale tests and benchmarks: a burst of requests all in
flight on one engine, each on its own model or all on one (LoRA adapters are served this
way: the adapter is the request's model), and a long backlog of ordinary traffic on a few
nodes, in the order its requests ended. Records as the stage mapper makes them from
vLLM's own spans (engine timeline, tokens, model, node, engine); the numbers are made up.
"""

from __future__ import annotations

import random

from tokenpath.records import RequestRecord

BURST_NODE = "burst-node"
BURST_ENGINE = "vllm-burst"


def adapter(index: int) -> str:
    """A LoRA adapter's name (not in the roofline catalog: its requests split equally)."""
    return f"lora-adapter-{index:05d}"


def _record(index: int, model: str, node: str, engine: str, start: float, decode_start: float,
            end: float, input_tokens: int, output_tokens: int) -> RequestRecord:
    return RequestRecord(
        trace_id=f"{index + 1:032x}", model=model, node=node, engine_id=engine,
        gpu_type="H100-SXM", start_unix=start - 0.01, end_unix=end + 0.01,
        input_tokens=input_tokens, output_tokens=output_tokens,
        prefill_seconds=decode_start - start, decode_seconds=end - decode_start,
        prefill_start_unix=start, decode_start_unix=decode_start, engine_end_unix=end)


def burst(start: float, count: int, models: int, seed: int = 5) -> list[RequestRecord]:
    """``count`` requests on one engine, scheduled within five seconds of ``start`` and
    decoding until about 13 s after it, so all are in flight together; request ``i`` on
    model ``adapter(i % models)``. In the order they ended."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        begin = start + 5.0 * i / count
        decode_start = begin + rng.uniform(0.05, 0.3)
        end = start + 12.0 + rng.uniform(0.0, 0.5)
        out.append(_record(i, adapter(i % models), BURST_NODE, BURST_ENGINE, begin,
                           decode_start, end, rng.randint(64, 4096), rng.randint(100, 600)))
    out.sort(key=lambda r: r.engine_end_unix or 0.0)
    return out


def backlog(end: float, count: int, nodes: int = 4, rate_per_node: float = 25.0,
            seed: int = 3) -> list[RequestRecord]:
    """``count`` requests spread over ``nodes`` nodes (one engine each, a few models),
    ``rate_per_node`` a second each, decodes of 0.2 to 4 s (tens in flight per node),
    the last ending at ``end``; in the order they ended."""
    rng = random.Random(seed)
    span = count / nodes / rate_per_node
    out = []
    for i in range(count):
        node = i % nodes
        begin = end - span - 5.0 + rng.uniform(0.0, span)
        decode_start = begin + rng.uniform(0.01, 0.3)
        finish = decode_start + rng.uniform(0.2, 4.0)
        out.append(_record(i, "llama-3.1-8b" if i % 3 else adapter(i % 7),
                           f"backlog-node-{node}", f"vllm-{node}", begin, decode_start, finish,
                           rng.randint(50, 8000), rng.randint(2, 600)))
    out.sort(key=lambda r: r.engine_end_unix or 0.0)
    return out


def closing_record(after: RequestRecord, seconds: float) -> RequestRecord:
    """A short request on ``after``'s engine ``seconds`` after it ended: its arrival moves
    the unit's watermark past everything before it (one large close)."""
    assert after.engine_end_unix is not None
    start = after.engine_end_unix + seconds
    return _record(10**9, after.model, after.node or "", after.engine_id or "", start,
                   start + 0.1, start + 0.5, 10, 5)
