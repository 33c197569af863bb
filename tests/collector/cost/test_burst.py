"""A burst of 3,000 requests in flight at once on one engine: request metrics and records
come out within the engine's watermark plus seconds, not minutes (the apportionment is
linear in the requests). Deadlines are generous; no timing threshold is asserted."""

from __future__ import annotations

import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.collector.conftest import ServiceFactory, wait_for
from tests.deploy.engine_traffic import burst_traffic
from tokenpath import metric_names as M
from tokenpath.collector.cost.attributor import AttributorConfig

pytestmark = pytest.mark.integration

BURST = 3_000
BATCH_SPANS = 500
# The slices close once the watermark (clock - the engine's arrival lag - margin) passes
# the burst's end; this much more is allowed for pricing 3,000 overlapping requests.
GENEROUS_SECONDS = 90.0


def _requests_total(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        text = response.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == M.REQUESTS.series)


def test_a_burst_of_3000_in_flight_is_priced_within_the_watermark(
        make_service: ServiceFactory) -> None:
    service = make_service(cost=AttributorConfig(tick_seconds=0.1))
    request = burst_traffic(time.time(), BURST)
    spans = list(request.resource_spans[0].scope_spans[0].spans)
    for i in range(0, len(spans), BATCH_SPANS):
        part = type(request)()
        part.resource_spans.add().CopyFrom(request.resource_spans[0])
        del part.resource_spans[0].scope_spans[0].spans[:]
        part.resource_spans[0].scope_spans[0].spans.extend(spans[i:i + BATCH_SPANS])
        post = urllib.request.Request(f"{service.http_url}/v1/traces",
                                      data=part.SerializeToString(),
                                      headers={"Content-Type": "application/x-protobuf"})
        with urllib.request.urlopen(post, timeout=30) as response:
            assert response.status == 200
    wait_for(lambda: service.attributor.pending_records == BURST or
             service.attributor.stats.records_out.value > 0, timeout=GENEROUS_SECONDS)
    delay = service.attributor.lateness_seconds
    wait_for(lambda: _requests_total(service.http_url) == BURST,
             timeout=delay + GENEROUS_SECONDS)
    wait_for(lambda: service.store.count() == BURST, timeout=GENEROUS_SECONDS)
    assert service.attributor.stats.late_records.value == 0
    assert service.attributor.pending_records == 0
