"""The roofline catalog: which roofline a record runs on, built once per key."""

from __future__ import annotations

from tokenpath.collector.cost import catalog
from tokenpath.collector.cost.catalog import (
    MAX_CACHED_ROOFLINES,
    catalog_model_name,
    roofline_for_record,
)
from tokenpath.records import RequestRecord
from tokenpath.roofline import GPUS, MODELS


def _record(model: str, tensor_parallel: int = 1) -> RequestRecord:
    record = RequestRecord(trace_id="0" * 32, model=model)
    record.tensor_parallel = tensor_parallel
    return record


def test_served_names_map_to_the_catalog() -> None:
    assert catalog_model_name("meta-llama/Llama-3.1-8B-Instruct") == "llama-3.1-8b"
    assert catalog_model_name("no-such-model") is None


def test_one_roofline_per_model_gpu_and_parallelism() -> None:
    gpu = next(iter(GPUS))
    first = roofline_for_record(_record("meta-llama/Llama-3.1-8B-Instruct"), gpu)
    again = roofline_for_record(_record("meta-llama/Llama-3.1-8B-Instruct"), gpu)
    assert first is not None and first is again
    assert first.model is MODELS["llama-3.1-8b"] and first.gpu is GPUS[gpu]
    wider = roofline_for_record(_record("meta-llama/Llama-3.1-8B-Instruct", 4), gpu)
    assert wider is not None and wider.tensor_parallel == 4 and wider is not first
    # a record that says 0 GPUs runs on one, as before the cache
    assert roofline_for_record(_record("meta-llama/Llama-3.1-8B-Instruct", 0), gpu) is first


def test_unknown_model_or_gpu_has_none() -> None:
    gpu = next(iter(GPUS))
    assert roofline_for_record(_record("no-such-model"), gpu) is None
    assert roofline_for_record(_record("no-such-model"), gpu) is None
    assert roofline_for_record(_record("llama-3.1-8b"), "no-such-gpu") is None


def test_the_table_stays_bounded_under_many_model_names() -> None:
    gpu = next(iter(GPUS))
    for index in range(MAX_CACHED_ROOFLINES * 2 + 3):
        roofline_for_record(_record(f"model-{index}"), gpu)
        assert len(catalog._ROOFLINES) <= MAX_CACHED_ROOFLINES
    assert roofline_for_record(_record("llama-3.1-8b"), gpu) is not None
