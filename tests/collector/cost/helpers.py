"""Shared pieces of the cost tests: a recording sink and a record builder."""

from __future__ import annotations

from tokenpath.records import IdleCost, RequestRecord


class RecordingSink:
    """A RecordSink that keeps what it is given."""

    def __init__(self) -> None:
        self.records: list[RequestRecord] = []
        self.idle: list[IdleCost] = []
        self.shutdowns = 0

    def consume_record(self, record: RequestRecord) -> None:
        self.records.append(record)

    def consume_idle_cost(self, idle: IdleCost) -> None:
        self.idle.append(idle)

    def shutdown(self) -> None:
        self.shutdowns += 1

    @property
    def idle_dollars(self) -> float:
        return sum(item.dollars for item in self.idle)


def engine_record(
    index: int,
    prefill_start: float,
    prefill_seconds: float,
    decode_seconds: float,
    *,
    node: str = "node-a",
    model: str = "llama-3.1-8b",
    gpu_type: str = "H100-SXM",
    input_tokens: int = 1000,
    cached_tokens: int = 0,
    output_tokens: int = 100,
    tensor_parallel: int = 1,
) -> RequestRecord:
    decode_start = prefill_start + prefill_seconds
    end = decode_start + decode_seconds
    return RequestRecord(
        trace_id=f"{index + 1:032x}",
        model=model,
        node=node,
        gpu_type=gpu_type,
        tensor_parallel=tensor_parallel,
        start_unix=prefill_start - 0.01,
        end_unix=end + 0.01,
        input_tokens=input_tokens,
        cache_read_tokens=cached_tokens,
        output_tokens=output_tokens,
        prefill_seconds=prefill_seconds,
        decode_seconds=decode_seconds,
        prefill_start_unix=prefill_start,
        decode_start_unix=decode_start,
        engine_end_unix=end,
    )
