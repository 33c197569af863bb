"""The `make bench` table: each figure read from the results, with what was measured
beside it in its own unit."""

from __future__ import annotations

from bench.__main__ import TARGETS


def test_the_whole_collector_rows_show_the_figure_net_of_idle_in_its_own_units() -> None:
    results = {"ingest": {"http": {"ratio_to_floor": 8.5, "cpu_us_per_span_net_of_idle": 34.5,
                                   "idle_cpu_percent_of_core": 4.0}}}
    label = "15-stage traces: whole collector CPU/span vs floor, OTLP/HTTP"
    (http,) = [t for t in TARGETS if t.label == label]
    assert http.value(results) == 8.5
    assert http.beside_text(results) == "net of idle 34.5 µs/span; idle 4 % of a core"
