"""Pushes agent snapshots to the collector as OTLP/HTTP protobuf metrics.

The request is built straight from the snapshot with opentelemetry-proto (no SDK meter
pipeline): counters become cumulative monotonic sums starting at the agent's start time,
gauges become gauges, labels become data point attributes, and the node name is a
resource attribute. Pushing runs on its own thread with a one-slot mailbox: a slow or
dead collector never delays polling, only the newest snapshot is sent, and failures are
counted (``tokenpath_agent_otlp_push_errors_total``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import httpx
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    AGGREGATION_TEMPORALITY_CUMULATIVE,
    Gauge,
    Metric,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from tokenpath.agent.snapshot import Snapshot

from tokenpath.attributes import NODE

logger = logging.getLogger(__name__)

OTLP_METRICS_PATH = "/v1/metrics"
PROTOBUF_CONTENT_TYPE = "application/x-protobuf"
SERVICE_NAME_KEY = "service.name"
HOST_NAME_KEY = "host.name"
AGENT_SERVICE_NAME = "tokenpath-agent"
SCOPE_NAME = __name__.rpartition(".")[0]  # tokenpath.agent


def _attribute(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def build_export_request(
    snapshot: Snapshot, *, node: str, start_unix_nano: int
) -> ExportMetricsServiceRequest:
    """The OTLP request for one snapshot."""
    metrics: list[Metric] = []
    now = snapshot.taken_unix_nano
    for spec, series in snapshot.points.items():
        points = [
            NumberDataPoint(
                attributes=[_attribute(k, v) for k, v in zip(spec.labels, labels, strict=True)],
                start_time_unix_nano=start_unix_nano,
                time_unix_nano=now,
                as_double=value,
            )
            for labels, value in series.items()
        ]
        if spec.type == "counter":
            metric = Metric(name=spec.name, description=spec.help, sum=Sum(
                data_points=points, is_monotonic=True,
                aggregation_temporality=AGGREGATION_TEMPORALITY_CUMULATIVE))
        else:
            metric = Metric(name=spec.name, description=spec.help, gauge=Gauge(data_points=points))
        metrics.append(metric)
    resource = Resource(attributes=[
        _attribute(SERVICE_NAME_KEY, AGENT_SERVICE_NAME),
        _attribute(NODE, node),
        _attribute(HOST_NAME_KEY, node),
    ])
    return ExportMetricsServiceRequest(resource_metrics=[ResourceMetrics(
        resource=resource,
        scope_metrics=[ScopeMetrics(scope=InstrumentationScope(name=SCOPE_NAME),
                                    metrics=metrics)],
    )])


class OtlpMetricsPusher:
    """Sends the newest snapshot to ``<collector>/v1/metrics`` off the polling thread."""

    def __init__(
        self,
        collector_url: str,
        *,
        node: str,
        start_unix_nano: int,
        client: httpx.Client,
        auth_token: str | None = None,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self._url = collector_url.rstrip("/") + OTLP_METRICS_PATH
        self._node = node
        self._start_unix_nano = start_unix_nano
        self._client = client
        self._headers = {"Content-Type": PROTOBUF_CONTENT_TYPE}
        if auth_token:
            self._headers["Authorization"] = f"Bearer {auth_token}"
        self._on_error = on_error
        self._pending: Snapshot | None = None
        self._wake = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.sent = 0
        self.failed = 0

    @property
    def url(self) -> str:
        return self._url

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tokenpath-agent-otlp",
                                            daemon=True)
            self._thread.start()

    def submit(self, snapshot: Snapshot) -> None:
        """Queue ``snapshot``, replacing any not yet sent."""
        with self._wake:
            self._pending = snapshot
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._pending is None and not self._stopping:
                    self._wake.wait()
                snapshot, self._pending = self._pending, None
                stopping = self._stopping
            if snapshot is not None:
                self.send(snapshot)
            if stopping:
                return

    def send(self, snapshot: Snapshot) -> bool:
        """Export one snapshot now; True on a 2xx answer. Never raises."""
        try:
            body = build_export_request(
                snapshot, node=self._node, start_unix_nano=self._start_unix_nano
            ).SerializeToString()
            response = self._client.post(self._url, content=body, headers=self._headers)
            ok = 200 <= response.status_code < 300
            if not ok:
                logger.warning("OTLP metrics push to %s: HTTP %s", self._url,
                               response.status_code)
        except Exception as exc:
            logger.warning("OTLP metrics push to %s failed: %s", self._url, exc)
            ok = False
        if ok:
            self.sent += 1
        else:
            self.failed += 1
            if self._on_error is not None:
                self._on_error()
        return ok

    def shutdown(self) -> None:
        """Send what is pending, then stop (idempotent)."""
        thread = self._thread
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if thread is not None:
            thread.join()
            self._thread = None
