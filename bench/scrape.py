"""A /metrics scrape with about 10k series: time to render the exposition."""

from __future__ import annotations

import json
import time
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from tokenpath.collector.prometheus_sink import STAGE_BUCKETS, PrometheusSink
from tokenpath.records import RequestRecord, StageTiming
from tokenpath.stages import STAGE_IDS, Provenance


def _series(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def build_sink(target_series: int = 10_000) -> tuple[PrometheusSink, int]:
    sink = PrometheusSink(max_models=10_000)
    i = 0
    while True:
        model = f"model-{i:04d}"
        record = RequestRecord(trace_id=format(i, "032x"), model=model, input_tokens=100,
                               output_tokens=10, ttft_seconds=0.1, tpot_seconds=0.01,
                               cost_dollars=0.001)
        for stage in STAGE_IDS:
            record.stages[stage] = StageTiming(stage, 0.01, Provenance.MEASURED, 0.0001)
        sink.consume_record(record)
        i += 1
        if i % 8 == 0:
            series = _series(sink.render())
            if series >= target_series:
                return sink, series


def run(target_series: int = 10_000, repeats: int = 20) -> dict[str, Any]:
    sink, series = build_sink(target_series)
    times = []
    size = 0
    for _ in range(repeats):
        t = time.perf_counter()
        size = len(sink.render())
        times.append(time.perf_counter() - t)
    # Baseline in the same run: prometheus_client rendering the same observations.
    baseline = _prometheus_client_baseline(sink)
    times.sort()
    median = times[len(times) // 2]
    return {"series": series, "bytes": size, "scrape_ms_median": median * 1e3,
            "scrape_ms_min": times[0] * 1e3,
            "prometheus_client_ms_median": baseline * 1e3,
            "ratio_to_prometheus_client": median / baseline}


def _prometheus_client_baseline(sink: PrometheusSink, repeats: int = 5) -> float:
    """prometheus_client's generate_latest over a registry with the same series."""
    from prometheus_client import Histogram

    registry = CollectorRegistry()
    hist = Histogram(sink.stage_duration.spec.name, "baseline",
                     list(sink.stage_duration.spec.labels), registry=registry,
                     buckets=STAGE_BUCKETS)
    target = _series(sink.render())
    per_model = len(STAGE_IDS) * (len(STAGE_BUCKETS) + 3)
    for model in range(target // per_model + 1):
        for stage in STAGE_IDS:
            hist.labels(stage.value, f"model-{model:04d}").observe(0.01)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        generate_latest(registry)
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2]


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
