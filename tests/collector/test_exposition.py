"""The fast exposition renders what prometheus_client would for the same observations."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tokenpath import metric_names as M
from tokenpath.collector.exposition import FastCounter, FastHistogram, render

BUCKETS = (0.001, 0.01, 0.1, 1.0, 10.0)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_same_samples_as_prometheus_client() -> None:
    rng = random.Random(3)
    registry = CollectorRegistry()
    ref_hist = Histogram(M.STAGE_DURATION.name, M.STAGE_DURATION.help,
                         M.STAGE_DURATION.labels, registry=registry, buckets=BUCKETS)
    ref_counter = Counter(M.TOKENS.name, M.TOKENS.help, M.TOKENS.labels, registry=registry)
    hist = FastHistogram(M.STAGE_DURATION, BUCKETS)
    counter = FastCounter(M.TOKENS)
    for _ in range(500):
        labels = (rng.choice(["router", "nic_tx"]), rng.choice(['m"1', "m\\2", "m\n3"]))
        value = rng.choice([0.001, 0.01, 10.0, 50.0, rng.random()])
        ref_hist.labels(*labels).observe(value)
        hist.labels(*labels).observe(value)
        amount = rng.randint(0, 1000)
        ref_counter.labels(labels[1], "input").inc(amount)
        counter.labels(labels[1], "input").inc(amount)
    ours = samples(render([hist, counter]))
    reference = samples(generate_latest(registry).decode())
    assert ours.keys() == reference.keys()
    for key, value in reference.items():
        assert ours[key] == pytest.approx(value), key


def test_counters_refuse_to_go_down() -> None:
    with pytest.raises(ValueError):
        FastCounter(M.TOKENS).labels("m", "input").inc(-1)


def test_empty_families_render_nothing() -> None:
    assert render([FastCounter(M.TOKENS), FastHistogram(M.TTFT, BUCKETS)]) == ""
