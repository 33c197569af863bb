"""The agent benchmark's machinery runs end to end (its figures are `make bench`'s)."""

from __future__ import annotations

import pytest

from bench import agent_bench
from bench.__main__ import TARGETS


def test_cpu_share_windows_run_each_process_alone_and_report_every_figure(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_bench, "WARMUP_SECONDS", 0.5)
    result = agent_bench.measure_cpu_share(window=1.0, rounds=2, scrape_interval=0.5)
    kinds = (agent_bench.AGENT, agent_bench.RAW_CALLS, agent_bench.IDLE_WAKE)
    assert set(result["windows"]) == set(kinds)
    for kind in kinds:
        assert len(result["windows"][kind]) == 2
        assert all(share > 0 for share in result["windows"][kind])
        assert result[f"{kind}_share_of_one_core"] > 0
    assert result["agent_scrapes"] >= 2  # one per agent window at least, as Prometheus
    assert result["otlp_pushes"] >= 2  # the agent pushed to the loopback sink


def test_poll_cost_compares_a_poll_with_its_raw_calls() -> None:
    cost = agent_bench.measure_poll_cost(agent_bench.fake_gpus(), iterations=20, rounds=1)
    assert cost["poll_seconds"] > 0 and cost["raw_calls_seconds"] > 0
    assert cost["poll_cost_ratio"] == cost["poll_seconds"] / cost["raw_calls_seconds"]


def test_the_bench_table_reads_the_agent_figures_and_what_was_measured_beside() -> None:
    results = {"agent": {"cpu_percent_of_core": 0.7, "cpu_percent_of_core_raw_calls_1hz": 0.5,
                         "cpu_percent_of_core_idle_wake_1hz": 0.2, "wake_penalty_ratio": 240,
                         "poll_ratio": 1.4}}
    agent_targets = {target.label: target for target in TARGETS if target.bench == "agent"}
    cpu = agent_targets["agent CPU share at 1 Hz"]
    assert cpu.value(results) == 0.7
    assert not cpu.holds(0.7)
    assert cpu.beside_text(results) == (
        "raw calls alone 0.5 %; idle wake alone 0.2 %; "
        "page touched after 1 s asleep vs back to back 240 x")


def test_wake_penalty_times_the_same_pages_back_to_back_and_after_a_sleep() -> None:
    penalty = agent_bench.measure_wake_penalty(pages=64, samples=2, sleep_seconds=0.01)
    assert penalty["pages"] == 64
    assert penalty["warm_us_per_page"] >= 0 and penalty["after_sleep_us_per_page"] > 0
    if penalty["warm_us_per_page"] > 0:
        assert penalty["wake_penalty_ratio"] == pytest.approx(
            penalty["after_sleep_us_per_page"] / penalty["warm_us_per_page"])


def test_asking_for_this_machines_driver_without_one_names_the_problem() -> None:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(RuntimeError, match="is the NVIDIA driver installed"):
        agent_bench.measure_poll_costs(agent_bench.SYSTEM_DRIVER)
