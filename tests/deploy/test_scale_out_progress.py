"""Sharded pricing in any order: three `tokenpath collector` replicas forwarding their
records (--forward-records) through the router, each reporting its progress per pricing
unit, price the same engine traffic as one lone collector given the same spans, to 1e-6
per request and with no record priced late, whatever the route does to one replica's
posts:

- (a) a backlog: the traffic 40 s old, sent to every replica at once;
- (b) live traffic with one replica's posts held back 30 s, then released
  (``cost.source_timeout_seconds`` above that);
- (c) live traffic with one replica's posts delayed by 15 to 25 s and reordered, its
  progress messages overtaking its records;
- (d) a replica killed for good after it forwarded its records: its units wait for
  ``cost.source_timeout_seconds``, the expiry is counted, the records are exact.

Each case runs on units of its own (its own engines and node), on one cluster.
"""

from __future__ import annotations

import math
import signal
import time
import urllib.request
from collections.abc import Iterator

import orjson
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.logs.v1.logs_pb2 import ResourceLogs
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans

from tests.deploy.cluster import SETTLE_TIMEOUT_SECONDS, Cluster, cluster, post, samples
from tests.deploy.engine_traffic import EngineTraffic, engine_traffic, lora_traffic, pd_traffic
from tests.deploy.router import resource_key
from tokenpath import attributes as A
from tokenpath import metric_names as mn
from tokenpath.identity import pricing_unit
from tokenpath.otlp_values import key_value
from tokenpath.records import RequestRecord

pytestmark = pytest.mark.integration

PER_ENGINE = 60
TIMEOUT_SECONDS = 40.0
HOLD_SECONDS = 30.0
BACKLOG_AGE_SECONDS = 40.0
# The collectors' defaults but three: the source timeout above the hold; a short discovery
# so a case does not wait 10 s for nothing; and an allowed lateness from the start above
# the longest request (8 s here), so that the lone collector, fed live, prices nothing
# late either (a fresh unit's first long requests would be: docs/cost-model.md), with room
# for a loaded machine's assembly delays. The 30 s hold and the 15 to 25 s delays go
# beyond that lateness while the other replicas' records keep coming: without the
# replicas' progress, the held or delayed replica's records are priced late (cases (b)
# and (c) fail with the sources switched off; (a) passed then too: whether a backlog
# breaks a lone watermark depends on how the replicas' batches interleave).
SETTINGS: dict[str, object] = {"cost": {"source_timeout_seconds": TIMEOUT_SECONDS,
                                        "source_discovery_seconds": 5,
                                        "min_delay_seconds": 15}}
LORA_MODELS = 300
LIVE_RPS = 3.0  # a slow live stream: 100 requests an engine take about 45 s
DELAY_SECONDS = (15.0, 25.0)
LIVE_STEP_SECONDS = 0.25


@pytest.fixture(name="cluster", scope="module")
def _cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with cluster(tmp_path_factory.mktemp("progress"), settings=SETTINGS) as running:
        yield running


def _records(url: str) -> dict[str, RequestRecord]:
    with urllib.request.urlopen(f"{url}/api/requests?limit=10000", timeout=30) as response:
        return {str(r["trace_id"]): RequestRecord.from_json(r)
                for r in orjson.loads(response.read())}


def _wait_for(urls: list[str], trace_ids: set[str]) -> dict[str, RequestRecord]:
    """Until the collectors at ``urls`` together hold every one of ``trace_ids``."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_SECONDS
    while True:
        held: dict[str, RequestRecord] = {}
        for url in urls:
            held.update((k, v) for k, v in _records(url).items() if k in trace_ids)
        if len(held) == len(trace_ids):
            return held
        assert time.monotonic() < deadline, f"{len(trace_ids) - len(held)} not priced"
        time.sleep(0.5)


def _counter(url: str, metric: mn.MetricSpec) -> float:
    return samples(url).get(metric.series, 0.0)


def _unit(record: RequestRecord) -> str:
    return pricing_unit(record.node, record.engine_id)


def _assert_priced_alike(cluster: Cluster, traffic: EngineTraffic,
                         units: set[str] | None = None,
                         shard_urls: list[str] | None = None) -> None:
    """Every request (of ``units``, all by default) priced on the replicas at the lone
    collector's GPU dollars to 1e-6, and so every unit's GPU dollars."""
    ids = set(traffic.trace_ids)
    alone = _wait_for([cluster.single.http_url], ids)
    if units is not None:
        ids = {i for i in ids if _unit(alone[i]) in units}
    sharded = _wait_for(shard_urls or [s.http_url for s in cluster.shards], ids)
    per_unit_alone: dict[str, float] = {}
    per_unit_sharded: dict[str, float] = {}
    for trace_id in ids:
        mine, theirs = alone[trace_id], sharded[trace_id]
        gpu_alone, gpu_sharded = mine.gpu_cost_dollars, theirs.gpu_cost_dollars
        assert gpu_alone > 0
        assert math.isclose(gpu_sharded, gpu_alone, rel_tol=1e-6), (
            f"{trace_id} on {_unit(mine)}: {gpu_sharded} sharded, {gpu_alone} alone; "
            f"{_late_counts(cluster, trace_id)}")
        unit = _unit(mine)
        per_unit_alone[unit] = per_unit_alone.get(unit, 0.0) + gpu_alone
        per_unit_sharded[unit] = per_unit_sharded.get(unit, 0.0) + gpu_sharded
    assert per_unit_alone.keys() == per_unit_sharded.keys()
    for unit, dollars in per_unit_alone.items():
        assert math.isclose(per_unit_sharded[unit], dollars, rel_tol=1e-6), unit


def _late_counts(cluster: Cluster, trace_id: str | None = None) -> dict[str, object]:
    """Each running collector's counts of what prices a record late or not at all, and
    (given ``trace_id``) every copy of that record it holds (for a failure's message)."""
    out: dict[str, object] = {}
    for p in cluster.processes:
        if p.process is None or p.process.poll() is not None:
            continue
        for m in (mn.RECORDS_LATE, mn.PRICING_SOURCES_EXPIRED, mn.RECORDS_WITHOUT_TIMELINE,
                  mn.RECORDS_DUPLICATE, mn.TRACES_EVICTED, mn.SPANS_DROPPED,
                  mn.PRICING_FORCED_CLOSES):
            out[f"{p.http_url} {m.name}"] = _counter(p.http_url, m)
        if trace_id is not None:
            url = f"{p.http_url}/api/requests?limit=10000"
            with urllib.request.urlopen(url, timeout=30) as response:
                out[f"{p.http_url} copies"] = [
                    {k: r.get(k) for k in ("record_id", "gpu_cost_dollars", "engine_id",
                                           "prefill_start_unix", "engine_end_unix")}
                    for r in orjson.loads(response.read()) if r["trace_id"] == trace_id]
    return out


def _no_late(cluster: Cluster) -> None:
    for process in cluster.processes:
        if process.process is not None and process.process.poll() is None:
            assert _counter(process.http_url, mn.RECORDS_LATE) == 0, process.http_url


def _span_end(span: object) -> float:
    return float(span.end_time_unix_nano) / 1e9  # type: ignore[attr-defined]


def _live_steps(traffic: EngineTraffic) -> list[tuple[float, bytes]]:
    """The traffic as its exporters would send it live: each span once its end time has
    passed, a step at a time (due time, export body)."""
    steps: dict[int, ExportTraceServiceRequest] = {}
    for resource_spans in traffic.request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                step = int(_span_end(span) / LIVE_STEP_SECONDS)
                part = ResourceSpans(resource=resource_spans.resource)
                part.scope_spans.append(ScopeSpans(scope=scope_spans.scope, spans=[span]))
                steps.setdefault(step, ExportTraceServiceRequest()).resource_spans.append(part)
    return [((step + 1) * LIVE_STEP_SECONDS, steps[step].SerializeToString())
            for step in sorted(steps)]


def _post_live(cluster: Cluster, steps: list[tuple[float, bytes]]) -> None:
    """Post each step to the lone collector and the router when it is due."""
    for due, body in steps:
        pause = due - time.time()
        if pause > 0:
            time.sleep(pause)  # pacing the workload, not waiting for a result
        post(f"{cluster.single.http_url}/v1/traces", body)
        post(f"{cluster.router.url}/v1/traces", body)


def _live_traffic(seed: int, per_engine: int) -> EngineTraffic:
    """Traffic whose timelines run from now on (sent as they end)."""
    def made(now: float) -> EngineTraffic:
        return engine_traffic(now, per_engine=per_engine, rps=LIVE_RPS, seed=seed,
                              node=f"node-{seed}")

    probe = made(time.time())
    return made(time.time() + probe.window[1] - probe.window[0])


def test_a_backlog_sent_to_every_replica_at_once(cluster: Cluster) -> None:
    traffic = engine_traffic(time.time() - BACKLOG_AGE_SECONDS, per_engine=PER_ENGINE,
                             seed=101, node="node-101")
    body = traffic.request.SerializeToString()
    post(f"{cluster.single.http_url}/v1/traces", body)
    post(f"{cluster.router.url}/v1/traces", body)
    _assert_priced_alike(cluster, traffic)
    _no_late(cluster)
    progress = sum(_counter(s.http_url, mn.PRICING_PROGRESS_IN) for s in cluster.shards)
    assert progress > 0  # the replicas' progress was what closed the units


def test_b_one_replica_held_back_then_released(cluster: Cluster) -> None:
    """Live traffic; once every replica has reported on the units, one replica's posts
    are held back 30 s, then released."""
    traffic = _live_traffic(202, 100)
    steps = _live_steps(traffic)
    first, rest = steps[:len(steps) // 4], steps[len(steps) // 4:]
    progress_before = sum(_counter(s.http_url, mn.PRICING_PROGRESS_IN) for s in cluster.shards)
    _post_live(cluster, first)
    victim = cluster.shards[0]
    deadline = time.monotonic() + SETTLE_TIMEOUT_SECONDS
    # the held replica is one of the units' known sources: its progress has arrived
    while _counter(victim.http_url, mn.PROGRESS_FORWARDED) == 0 or sum(
            _counter(s.http_url, mn.PRICING_PROGRESS_IN)
            for s in cluster.shards) == progress_before:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    time.sleep(2 * LIVE_STEP_SECONDS)  # a tick or two of its progress on these units
    held_since = time.monotonic()
    cluster.router.hold(0)
    try:
        _post_live(cluster, rest)
        left = HOLD_SECONDS - (time.monotonic() - held_since)
        if left > 0:
            time.sleep(left)  # the scenario: the route holds one replica for 30 s
        ids = set(traffic.trace_ids)
        priced = {k for url in (s.http_url for s in cluster.shards)
                  for k in _records(url) if k in ids}
        assert len(priced) < len(ids)  # the units wait for the held replica
    finally:
        cluster.router.release(0)
    _assert_priced_alike(cluster, traffic)
    _no_late(cluster)
    assert sum(_counter(s.http_url, mn.PRICING_SOURCES_EXPIRED) for s in cluster.shards) == 0


def test_c_one_replica_delayed_and_reordered(cluster: Cluster) -> None:
    traffic = _live_traffic(303, PER_ENGINE)
    cluster.router.delay(0, *DELAY_SECONDS, seed=3)
    try:
        _post_live(cluster, _live_steps(traffic))
        _assert_priced_alike(cluster, traffic)
    finally:
        cluster.router.undelay(0)
    _no_late(cluster)


def _split_pairs(cluster: Cluster, count: int) -> list[tuple[str, str]]:
    """``count`` (prefill node, decode node) pairs whose units the router sends to
    different replicas: the parts meet across collectors."""
    def replica(node: str) -> str:
        resource = ResourceLogs()
        resource.resource.attributes.append(key_value(A.NODE, node))
        return cluster.router.ring.endpoint_for(resource_key(resource))

    pairs: list[tuple[str, str]] = []
    for i in range(1000):
        prefill, decode = f"pd-prefill-{i}", f"pd-decode-{i}"
        if replica(prefill) != replica(decode):
            pairs.append((prefill, decode))
            if len(pairs) == count:
                return pairs
    raise AssertionError("the ring put every pair on one replica")


def test_a_disaggregated_workload_is_priced_as_one_collector_prices_it(
        cluster: Cluster) -> None:
    """Prefill and decode on separate engines and nodes: each replica forwards a record's
    prefill part to the prefill engine's unit and the record to the decode engine's; the
    prefill's collector prices its part and sends it on, priced, to the decode's, which
    merges the two. Every request's dollars and KV bytes are the lone collector's."""
    traffic = pd_traffic(time.time() - 5.0, _split_pairs(cluster, 2), per_pair=PER_ENGINE)
    body = traffic.request.SerializeToString()
    post(f"{cluster.single.http_url}/v1/traces", body)
    post(f"{cluster.router.url}/v1/traces", body)
    ids = set(traffic.trace_ids)
    alone = _wait_for([cluster.single.http_url], ids)
    sharded = _wait_for([s.http_url for s in cluster.shards], ids)
    assert all(r.prefill_engine_id and r.decode_engine_id for r in alone.values())
    for trace_id, mine in alone.items():
        theirs = sharded[trace_id]
        assert theirs.record_id == mine.record_id  # one record, merged from its parts
        assert (theirs.prefill_engine_id, theirs.decode_engine_id) == (
            mine.prefill_engine_id, mine.decode_engine_id)
        assert theirs.kv_transfer_bytes == mine.kv_transfer_bytes
        assert mine.gpu_cost_dollars > 0
        assert math.isclose(theirs.gpu_cost_dollars, mine.gpu_cost_dollars, rel_tol=1e-6), (
            f"{trace_id}: {theirs.gpu_cost_dollars} sharded, {mine.gpu_cost_dollars} alone; "
            f"{_late_counts(cluster, trace_id)}")
        assert math.isclose(theirs.cost_dollars, mine.cost_dollars, rel_tol=1e-6)
    _no_late(cluster)


def test_many_models_on_one_node_sent_late(cluster: Cluster) -> None:
    """300 requests in flight on one engine, each on its own model (LoRA adapters),
    40 s old and sent to every replica at once: the engine's GPUs split among all of
    them as one collector splits them."""
    traffic = lora_traffic(time.time() - BACKLOG_AGE_SECONDS, LORA_MODELS)
    body = traffic.request.SerializeToString()
    post(f"{cluster.single.http_url}/v1/traces", body)
    post(f"{cluster.router.url}/v1/traces", body)
    _assert_priced_alike(cluster, traffic)
    alone = _wait_for([cluster.single.http_url], set(traffic.trace_ids))
    assert len({r.model for r in alone.values()}) == LORA_MODELS
    _no_late(cluster)


def test_d_a_replica_killed_for_good(cluster: Cluster) -> None:
    traffic = engine_traffic(time.time(), per_engine=PER_ENGINE, seed=404, node="node-404")
    ids = set(traffic.trace_ids)
    expired_at_start = {s.http_url: _counter(s.http_url, mn.PRICING_SOURCES_EXPIRED)
                        for s in cluster.shards}
    body = traffic.request.SerializeToString()
    post(f"{cluster.single.http_url}/v1/traces", body)
    post(f"{cluster.router.url}/v1/traces", body)
    # every replica forwarded every record it mapped (the router sent each to its unit's)
    routed = cluster.router.record_replica
    deadline = time.monotonic() + SETTLE_TIMEOUT_SECONDS
    while not ids <= routed.keys():
        assert time.monotonic() < deadline, f"{len(ids - routed.keys())} not forwarded"
        time.sleep(0.2)
    # the victim: a replica that mapped records a survivor prices (the ring over the
    # replicas' random ports may put all three units on any one of them)
    victim = next(s for s in cluster.shards if any(
        routed[t] != s.http_url for t in ids
        if cluster.router.ring.endpoint_for(bytes.fromhex(t)) == s.http_url))
    survivors = [s for s in cluster.shards if s is not victim]
    expired_before = sum(expired_at_start[s.http_url] for s in survivors)
    # it forwarded every record it mapped, then dies without a word
    assert victim.process is not None
    victim.process.send_signal(signal.SIGKILL)
    victim.process.wait(timeout=30)
    cluster.router.remove(victim.http_url)
    alone = _wait_for([cluster.single.http_url], set(traffic.trace_ids))
    # the units a survivor prices (the victim priced the others: they died with it)
    units = {_unit(alone[t]) for t in traffic.trace_ids
             if cluster.router.record_replica.get(t) in {s.http_url for s in survivors}}
    assert units
    _assert_priced_alike(cluster, traffic, units, [s.http_url for s in survivors])
    # its last progress did not cover its records' slices: they were priced once it had
    # been silent for the timeout and left the minimum, counted
    expired = sum(_counter(s.http_url, mn.PRICING_SOURCES_EXPIRED) for s in survivors)
    assert expired > expired_before
    for process in (cluster.single, *survivors):
        assert _counter(process.http_url, mn.RECORDS_LATE) == 0

