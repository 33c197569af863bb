"""Engine /metrics normalization against real loopback HTTP servers."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest

from testkit.fakes.engine_pages import render_sglang, render_vllm
from tests.agent.conftest import PageServer
from tokenpath import metric_names as mn
from tokenpath.agent.engine_names import (
    ENGINE_METRIC_RULES,
    ENGINE_SGLANG,
    ENGINE_VLLM,
    SOURCE_LINE_PREFIXES,
)
from tokenpath.agent.engine_scraper import EngineScraper, endpoint_source
from tokenpath.agent.http_fetch import HttpClient, KeepAliveHttpClient
from tokenpath.agent.nic_sampler import NicSampler
from tokenpath.agent.node_poller import NodePoller
from tokenpath.agent.nvml_sampler import NvmlSampler
from tokenpath.agent.prom_text import iter_samples
from tokenpath.agent.snapshot import ErrorCounts
from tokenpath.labels import BoundedLabel

VLLM_MODEL = "tiny-llama"
SGLANG_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
V = (ENGINE_VLLM, VLLM_MODEL)
S = (ENGINE_SGLANG, SGLANG_MODEL)


@pytest.fixture
def client() -> httpx.Client:
    with httpx.Client(timeout=2.0) as client:
        yield client  # type: ignore[misc]


def scraper_for(urls: list[str], client: HttpClient, max_models: int = 8) -> EngineScraper:
    return EngineScraper(urls, client, model_label=BoundedLabel(max_models))


def test_vllm_sglang_and_a_dead_endpoint(page_server: PageServer, dead_url: str,
                                         client: httpx.Client) -> None:
    page_server.pages["/vllm"] = render_vllm()
    page_server.pages["/sglang"] = render_sglang()
    urls = [page_server.url("/vllm"), page_server.url("/sglang"), dead_url]
    errors = ErrorCounts(16)
    readings = scraper_for(urls, client).read(errors)
    c, g = readings.counters, readings.gauges
    # vLLM 0.32 names.
    assert c[(mn.ENGINE_PREFIX_HIT_TOKENS, V)] == 2048
    assert c[(mn.ENGINE_PREFIX_QUERY_TOKENS, V)] == 4096
    assert c[(mn.ENGINE_PROMPT_TOKENS_CACHED, V)] == 2048
    assert c[(mn.ENGINE_ESTIMATED_FLOPS, V)] == 1.5e12
    assert c[(mn.ENGINE_ESTIMATED_READ_BYTES, V)] == 3.2e9
    assert c[(mn.ENGINE_SPEC_DRAFT, V)] == 300
    assert c[(mn.ENGINE_SPEC_ACCEPTED, V)] == 210
    assert g[(mn.ENGINE_REQUESTS_RUNNING, V)] == 3
    assert g[(mn.ENGINE_REQUESTS_WAITING, V)] == 1
    assert g[(mn.ENGINE_KV_USAGE, V)] == 0.25
    # SGLang names: cached tokens summed over cache_source, prompt tokens are queries.
    assert c[(mn.ENGINE_PREFIX_HIT_TOKENS, S)] == 4000
    assert c[(mn.ENGINE_PREFIX_QUERY_TOKENS, S)] == 10000
    assert g[(mn.ENGINE_REQUESTS_RUNNING, S)] == 5
    assert g[(mn.ENGINE_REQUESTS_WAITING, S)] == 2
    assert g[(mn.ENGINE_KV_USAGE, S)] == 0.28
    assert g[(mn.ENGINE_PREFIX_HIT_RATE, S)] == 0.42
    assert g[(mn.ENGINE_SPEC_ACCEPT_LENGTH, S)] == 2.5
    # Nothing else leaks through (histograms, _created, process metrics).
    assert {spec for spec, _ in [*c, *g]} <= {rule.target for rule in ENGINE_METRIC_RULES}
    # The dead endpoint is counted and marked down; the live ones are up.
    dead_source = endpoint_source(dead_url)
    assert errors.get(dead_source) == 1.0
    assert readings.up[dead_source] == 0.0
    assert readings.up[endpoint_source(page_server.url("/vllm"))] == 1.0


def test_dead_endpoint_is_retried_next_poll(page_server: PageServer,
                                            client: httpx.Client) -> None:
    url = page_server.url("/vllm")
    scraper = scraper_for([url], client)
    errors = ErrorCounts(16)
    assert scraper.read(errors).up[endpoint_source(url)] == 0.0  # 404: no page yet
    page_server.pages["/vllm"] = render_vllm()
    readings = scraper.read(errors)
    assert readings.up[endpoint_source(url)] == 1.0
    assert readings.counters[(mn.ENGINE_PREFIX_HIT_TOKENS, V)] == 2048
    assert errors.get(endpoint_source(url)) == 1.0


def test_counters_survive_an_engine_restart_and_an_outage(page_server: PageServer,
                                                          client: httpx.Client) -> None:
    url = page_server.url("/vllm")
    scraper = scraper_for([url], client)
    errors = ErrorCounts(16)
    page_server.pages["/vllm"] = render_vllm(hits=1000, queries=3000)
    scraper.read(errors)
    page_server.pages["/vllm"] = render_vllm(hits=1500, queries=4000)
    assert scraper.read(errors).counters[(mn.ENGINE_PREFIX_HIT_TOKENS, V)] == 1500
    # Engine down: counters hold their totals, gauges are dropped.
    del page_server.pages["/vllm"]
    down = scraper.read(errors)
    assert down.counters[(mn.ENGINE_PREFIX_HIT_TOKENS, V)] == 1500
    assert (mn.ENGINE_REQUESTS_RUNNING, V) not in down.gauges
    # Engine restarted: its counters start again from zero.
    page_server.pages["/vllm"] = render_vllm(hits=100, queries=300)
    after = scraper.read(errors)
    assert after.counters[(mn.ENGINE_PREFIX_HIT_TOKENS, V)] == 1600
    assert after.counters[(mn.ENGINE_PREFIX_QUERY_TOKENS, V)] == 4300
    assert scraper.restarts_seen >= 2


def test_two_endpoints_same_model_add_counts_and_average_ratios(
        page_server: PageServer, client: httpx.Client) -> None:
    page_server.pages["/a"] = render_vllm(running=2, kv_usage=0.2, hits=10)
    page_server.pages["/b"] = render_vllm(running=4, kv_usage=0.6, hits=30)
    readings = scraper_for([page_server.url("/a"), page_server.url("/b")], client).read(
        ErrorCounts(16))
    assert readings.gauges[(mn.ENGINE_REQUESTS_RUNNING, V)] == 6
    assert readings.gauges[(mn.ENGINE_KV_USAGE, V)] == pytest.approx(0.4)
    assert readings.counters[(mn.ENGINE_PREFIX_HIT_TOKENS, V)] == 40


def test_older_vllm_names(page_server: PageServer, client: httpx.Client) -> None:
    page_server.pages["/old"] = "\n".join([
        "# TYPE vllm:gpu_prefix_cache_hits_total counter",
        'vllm:gpu_prefix_cache_hits_total{engine="0",model_name="m"} 7.0',
        "# TYPE vllm:gpu_prefix_cache_queries_total counter",
        'vllm:gpu_prefix_cache_queries_total{engine="0",model_name="m"} 9.0',
        "# TYPE vllm:gpu_cache_usage_perc gauge",
        'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.5',
        "",
    ])
    readings = scraper_for([page_server.url("/old")], client).read(ErrorCounts(16))
    assert readings.counters[(mn.ENGINE_PREFIX_HIT_TOKENS, (ENGINE_VLLM, "m"))] == 7
    assert readings.counters[(mn.ENGINE_PREFIX_QUERY_TOKENS, (ENGINE_VLLM, "m"))] == 9
    assert readings.gauges[(mn.ENGINE_KV_USAGE, (ENGINE_VLLM, "m"))] == 0.5


def test_older_name_is_ignored_when_its_successor_is_on_the_same_page(
        page_server: PageServer, client: httpx.Client) -> None:
    page_server.pages["/both"] = "\n".join([
        'vllm:gpu_prefix_cache_hits_total{model_name="m"} 7.0',
        'vllm:prefix_cache_hits_total{model_name="m"} 7.0',
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.9',
        'vllm:kv_cache_usage_perc{model_name="m"} 0.5',
        "",
    ])
    readings = scraper_for([page_server.url("/both")], client).read(ErrorCounts(16))
    assert readings.counters[(mn.ENGINE_PREFIX_HIT_TOKENS, (ENGINE_VLLM, "m"))] == 7
    assert readings.gauges[(mn.ENGINE_KV_USAGE, (ENGINE_VLLM, "m"))] == 0.5


def test_garbage_page_is_an_error_not_a_crash(page_server: PageServer,
                                              client: httpx.Client) -> None:
    page_server.pages["/bad"] = 'vllm:num_requests_running{model_name="m"} not-a-number\n'
    url = page_server.url("/bad")
    errors = ErrorCounts(16)
    readings = scraper_for([url], client).read(errors)
    assert readings.up[endpoint_source(url)] == 0.0
    assert errors.get(endpoint_source(url)) == 1.0


def test_model_label_is_bounded(page_server: PageServer, client: httpx.Client) -> None:
    page_server.pages["/many"] = "\n".join(
        f'vllm:num_requests_running{{model_name="m{i}"}} 1' for i in range(5)) + "\n"
    readings = scraper_for([page_server.url("/many")], client, max_models=2).read(
        ErrorCounts(16))
    models = {labels[1] for spec, labels in readings.gauges}
    assert models == {"m0", "m1", mn.OTHER_LABEL_VALUE}
    assert readings.gauges[(mn.ENGINE_REQUESTS_RUNNING, (ENGINE_VLLM, mn.OTHER_LABEL_VALUE))] == 3


def test_only_rule_lines_are_read() -> None:
    names = {name for name, _, _ in iter_samples(render_vllm(), SOURCE_LINE_PREFIXES)}
    assert "vllm:prefix_cache_hits_total" in names
    assert not any("time_to_first_token" in name for name in names)


@pytest.fixture(params=["keep-alive", "httpx"])
def any_client(request: pytest.FixtureRequest) -> Iterator[HttpClient]:
    """The agent's own client (requests split over two polls) and httpx (no split: each
    request completes when it is sent)."""
    client: HttpClient = (KeepAliveHttpClient(timeout=2.0) if request.param == "keep-alive"
                          else httpx.Client(timeout=2.0))
    yield client
    client.close()


def poller_for(scraper: EngineScraper, now: list[float], engine_interval: float) -> NodePoller:
    return NodePoller(
        nvml_sampler=NvmlSampler(None, lambda: now[0]),
        nic_sampler=NicSampler(source="sysfs", sysfs_root="/nonexistent"),  # type: ignore[arg-type]
        engine_scraper=scraper, clock=lambda: now[0], wall_clock_ns=lambda: 1,
        max_devices=4, max_sources=8, engine_interval=engine_interval)


def test_poller_fetches_engines_every_engine_interval_and_repeats_them_between(
        page_server: PageServer, dead_url: str, any_client: HttpClient) -> None:
    now = [100.0]
    page_server.pages["/vllm"] = render_vllm(hits=100)
    poller = poller_for(scraper_for([page_server.url("/vllm"), dead_url], any_client), now,
                        engine_interval=5.0)
    hits = (mn.ENGINE_PREFIX_HIT_TOKENS, V)
    dead = endpoint_source(dead_url)
    first = poller.poll()  # the first poll reads the pages at once
    assert first.get(*hits) == 100
    assert page_server.gets == 1
    page_server.pages["/vllm"] = render_vllm(hits=300)
    for _ in range(4):  # within the interval: the last readings, no new fetch
        now[0] += 1.0
        snapshot = poller.poll()
        assert snapshot.get(*hits) == 100
        assert snapshot.get(mn.ENGINE_UP, (dead,)) == 0.0
    assert page_server.gets == 1
    assert poller.errors.get(dead) == 1.0
    now[0] += 1.0  # due: this poll sends the requests, the next one reads the pages
    assert poller.poll().get(*hits) == 100
    assert poller.errors.get(dead) == 1.0
    now[0] += 1.0
    assert poller.poll().get(*hits) == 300
    assert poller.errors.get(dead) == 2.0
    assert page_server.gets == 2
    now[0] += 1.0
    assert poller.poll().get(*hits) == 300  # not due again until 5 s after the request
    assert page_server.gets == 2


def test_poller_with_engines_every_poll_reads_each_request_at_the_next_poll(
        page_server: PageServer, any_client: HttpClient) -> None:
    now = [100.0]
    page_server.pages["/vllm"] = render_vllm(hits=100)
    poller = poller_for(scraper_for([page_server.url("/vllm")], any_client), now,
                        engine_interval=1.0)
    hits = (mn.ENGINE_PREFIX_HIT_TOKENS, V)
    assert poller.poll().get(*hits) == 100
    for value in (200, 300, 400):
        now[0] += 1.0
        poller.poll()  # reads the request sent at the poll before, sends one for `value`
        page_server.pages["/vllm"] = render_vllm(hits=value)
        now[0] += 1.0
        poller.poll()  # reads the request for `value` (the page may be either)...
        now[0] += 1.0
        assert poller.poll().get(*hits) == value  # ...and this one's is `value`
    poller.shutdown()


def test_shutdown_closes_a_request_not_yet_read(page_server: PageServer) -> None:
    page_server.pages["/vllm"] = render_vllm()
    client = KeepAliveHttpClient(timeout=2.0)
    scraper = scraper_for([page_server.url("/vllm")], client)
    now = [100.0]
    poller = poller_for(scraper, now, engine_interval=1.0)
    poller.poll()
    now[0] += 1.0
    poller.poll()  # sends a request, read at the next poll
    assert scraper.pending
    sockets = [request._connection.sock  # type: ignore[attr-defined]
               for request in scraper._pending or ()]
    poller.shutdown()
    client.close()
    assert not scraper.pending
    assert [sock.fileno() for sock in sockets] == [-1]


def test_a_url_the_client_cannot_use_is_one_counted_error(
        page_server: PageServer) -> None:
    page_server.pages["/vllm"] = render_vllm()
    bad = ["http://127.0.0.1:9/m\u00e9trics", "http://bad host:80/metrics"]
    client = KeepAliveHttpClient(timeout=2.0)
    try:
        errors = ErrorCounts(16)
        readings = scraper_for([*bad, page_server.url("/vllm")], client).read(errors)
    finally:
        client.close()
    assert readings.counters[(mn.ENGINE_PREFIX_HIT_TOKENS, V)] == 2048
    assert sorted(source for source, _ in errors.items()) == sorted(
        endpoint_source(url) for url in bad)


def test_engine_requests_are_in_flight_together(page_server: PageServer) -> None:
    """Each engine answers only once all of them have been asked: fetched one after
    another, the first would wait out its timeout; sent together, all answer."""
    engines = 4
    arrived = threading.Barrier(engines, timeout=10.0)
    page_server.before_get = arrived.wait
    for index in range(engines):
        page_server.pages[f"/e{index}"] = render_vllm(model=f"m{index}", hits=index)
    urls = [page_server.url(f"/e{index}") for index in range(engines)]
    client = KeepAliveHttpClient(timeout=5.0)
    try:
        errors = ErrorCounts(16)
        readings = scraper_for(urls, client).read(errors)
    finally:
        client.close()
    assert errors.items() == []
    assert set(readings.up.values()) == {1.0}
    assert sum(value for (spec, _), value in readings.counters.items()
               if spec is mn.ENGINE_PREFIX_HIT_TOKENS) == sum(range(engines))


@pytest.mark.parametrize("page", [
    "<html><body>404 page not found</body></html>\n",
    "# HELP python_gc_objects_collected_total Objects collected.\n"
    "python_gc_objects_collected_total 12.0\n",  # a /metrics without engine series
    "",
])
def test_a_200_page_without_engine_metrics_is_counted_and_down(
        page_server: PageServer, client: httpx.Client, page: str) -> None:
    url = page_server.url("/vllm")
    scraper = scraper_for([url], client)
    errors = ErrorCounts(16)
    page_server.pages["/vllm"] = render_vllm(hits=1000)
    assert scraper.read(errors).up[endpoint_source(url)] == 1.0
    page_server.pages["/vllm"] = page
    garbled = scraper.read(errors)
    assert garbled.up[endpoint_source(url)] == 0.0
    assert errors.get(endpoint_source(url)) == 1.0
    # Like a dead endpoint: counters hold their totals, gauges are dropped.
    assert garbled.counters[(mn.ENGINE_PREFIX_HIT_TOKENS, V)] == 1000
    assert (mn.ENGINE_REQUESTS_RUNNING, V) not in garbled.gauges


def test_an_engine_that_declares_its_families_but_has_no_sample_yet_is_up(
        page_server: PageServer, client: httpx.Client) -> None:
    # prometheus_client shows a labelled family's HELP and TYPE but no sample until its
    # first .labels() call: an engine that has served nothing yet.
    url = page_server.url("/sglang")
    page_server.pages["/sglang"] = (
        "# HELP sglang:num_running_reqs The number of running requests.\n"
        "# TYPE sglang:num_running_reqs gauge\n"
        "# HELP python_gc_objects_collected_total Objects collected during gc\n"
        "# TYPE python_gc_objects_collected_total counter\n"
        'python_gc_objects_collected_total{generation="0"} 12.0\n')
    scraper = scraper_for([url], client)
    errors = ErrorCounts(16)
    readings = scraper.read(errors)
    assert readings.up[endpoint_source(url)] == 1.0
    assert errors.get(endpoint_source(url)) == 0.0
    assert readings.gauges == {}


def test_the_engines_2026_metrics(page_server: PageServer, client: httpx.Client) -> None:
    """vLLM's prompt tokens by source, NIXL KV transfer and KV block residency, SGLang's
    realtime tokens, per-stage latency and P/D transfer failures, as the engines expose
    them (names from their sources: agent/engine_names.py)."""
    page_server.pages["/vllm"] = "\n".join([
        "# TYPE vllm:prompt_tokens_by_source_total counter",
        'vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 700',
        'vllm:prompt_tokens_by_source_total{engine="0",model_name="m",'
        'source="local_cache_hit"} 250',
        'vllm:prompt_tokens_by_source_total{engine="0",model_name="m",'
        'source="external_kv_transfer"} 50',
        "# TYPE vllm:nixl_xfer_time_seconds histogram",
        'vllm:nixl_xfer_time_seconds_bucket{engine="0",model_name="m",le="0.005"} 1',
        'vllm:nixl_xfer_time_seconds_sum{engine="0",model_name="m"} 0.75',
        'vllm:nixl_xfer_time_seconds_count{engine="0",model_name="m"} 12',
        "# TYPE vllm:nixl_bytes_transferred histogram",
        'vllm:nixl_bytes_transferred_sum{engine="0",model_name="m"} 4.0e9',
        'vllm:nixl_bytes_transferred_count{engine="0",model_name="m"} 12',
        "# TYPE vllm:nixl_num_failed_transfers_total counter",
        'vllm:nixl_num_failed_transfers_total{engine="0",model_name="m"} 1',
        "# TYPE vllm:kv_block_lifetime_seconds histogram",
        'vllm:kv_block_lifetime_seconds_sum{engine="0",model_name="m"} 90',
        'vllm:kv_block_lifetime_seconds_count{engine="0",model_name="m"} 30',
        "",
    ])
    page_server.pages["/sglang"] = "\n".join([
        "# TYPE sglang:realtime_tokens_total counter",
        'sglang:realtime_tokens_total{model_name="s",mode="prefill_compute"} 300',
        'sglang:realtime_tokens_total{model_name="s",mode="prefill_cache"} 100',
        'sglang:realtime_tokens_total{model_name="s",mode="decode"} 999',
        "# TYPE sglang:per_stage_req_latency_seconds histogram",
        'sglang:per_stage_req_latency_seconds_sum{model_name="s",stage="prefill_forward"} 2.5',
        'sglang:per_stage_req_latency_seconds_count{model_name="s",stage="prefill_forward"} 10',
        "# TYPE sglang:num_transfer_failed_reqs_total counter",
        'sglang:num_transfer_failed_reqs_total{model_name="s"} 2',
        "",
    ])
    readings = scraper_for([page_server.url("/vllm"), page_server.url("/sglang")],
                           client).read(ErrorCounts(16))
    c = readings.counters
    by_source = mn.ENGINE_PROMPT_TOKENS_BY_SOURCE
    assert c[(by_source, (ENGINE_VLLM, "m", mn.TOKEN_SOURCE_COMPUTE))] == 700
    assert c[(by_source, (ENGINE_VLLM, "m", mn.TOKEN_SOURCE_LOCAL_CACHE))] == 250
    assert c[(by_source, (ENGINE_VLLM, "m", mn.TOKEN_SOURCE_KV_TRANSFER))] == 50
    assert c[(mn.ENGINE_KV_TRANSFER_SECONDS, (ENGINE_VLLM, "m"))] == 0.75
    assert c[(mn.ENGINE_KV_TRANSFERS, (ENGINE_VLLM, "m"))] == 12
    assert c[(mn.ENGINE_KV_TRANSFER_BYTES, (ENGINE_VLLM, "m"))] == 4.0e9
    assert c[(mn.ENGINE_KV_TRANSFER_FAILURES, (ENGINE_VLLM, "m"))] == 1
    assert c[(mn.ENGINE_KV_BLOCK_EVICTIONS, (ENGINE_VLLM, "m"))] == 30
    assert c[(mn.ENGINE_KV_BLOCK_LIFETIME_SECONDS, (ENGINE_VLLM, "m"))] == 90
    assert c[(by_source, (ENGINE_SGLANG, "s", mn.TOKEN_SOURCE_COMPUTE))] == 300
    assert c[(by_source, (ENGINE_SGLANG, "s", mn.TOKEN_SOURCE_LOCAL_CACHE))] == 100
    assert not any(k[0] is by_source and k[1][2] == "decode" for k in c)  # not a prompt source
    assert c[(mn.ENGINE_STAGE_SECONDS, (ENGINE_SGLANG, "s", "prefill_forward"))] == 2.5
    assert c[(mn.ENGINE_STAGE_REQUESTS, (ENGINE_SGLANG, "s", "prefill_forward"))] == 10
    assert c[(mn.ENGINE_KV_TRANSFER_FAILURES, (ENGINE_SGLANG, "s"))] == 2
