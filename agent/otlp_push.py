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
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    AGGREGATION_TEMPORALITY_CUMULATIVE,
    Metric,
    NumberDataPoint,
)

from tokenpath import attributes as A
from tokenpath import metric_names as mn
from tokenpath.agent.http_fetch import HttpClient
from tokenpath.agent.snapshot import LabelValues, Snapshot
from tokenpath.attributes import NODE
from tokenpath.metric_names import MetricSpec
from tokenpath.otlp_values import key_value

logger = logging.getLogger(__name__)

OTLP_METRICS_PATH = "/v1/metrics"
PROTOBUF_CONTENT_TYPE = "application/x-protobuf"
SERVICE_NAME_KEY = A.SERVICE_NAME
HOST_NAME_KEY = A.HOST_NAME
AGENT_SERVICE_NAME = "tokenpath-agent"
SCOPE_NAME = __name__.rpartition(".")[0]  # tokenpath.agent


class OtlpRequestBuilder:
    """Builds the export request for each snapshot, reusing the previous message.

    Constructing ~150 protobuf data points from scratch every second costs more CPU
    than the poll itself; instead the request is kept and only values and timestamps
    are written, and it is rebuilt only when a series disappears.
    """

    def __init__(self, *, node: str, start_unix_nano: int) -> None:
        self._node = node
        self._start_unix_nano = start_unix_nano
        self._reset()

    def _reset(self) -> None:
        self._request = ExportMetricsServiceRequest()
        resource_metrics = self._request.resource_metrics.add()
        resource_metrics.resource.attributes.extend([
            key_value(SERVICE_NAME_KEY, AGENT_SERVICE_NAME),
            key_value(NODE, self._node),
            key_value(HOST_NAME_KEY, self._node),
        ])
        self._scope = resource_metrics.scope_metrics.add()
        self._scope.scope.name = SCOPE_NAME
        self._containers: dict[MetricSpec, Any] = {}
        self._points: dict[tuple[MetricSpec, LabelValues], NumberDataPoint] = {}

    def _container(self, spec: MetricSpec) -> Any:
        container = self._containers.get(spec)
        if container is None:
            metric: Metric = self._scope.metrics.add()
            metric.name = spec.name
            metric.description = spec.help
            if spec.type == "counter":
                metric.sum.is_monotonic = True
                metric.sum.aggregation_temporality = AGGREGATION_TEMPORALITY_CUMULATIVE
                container = metric.sum
            else:
                container = metric.gauge
            self._containers[spec] = container
        return container

    def build(self, snapshot: Snapshot) -> ExportMetricsServiceRequest:
        """The request for ``snapshot`` (the same object each call; serialize it now)."""
        now = snapshot.taken_unix_nano
        points = self._points
        seen = 0
        for spec, series in snapshot.points.items():
            container = None
            for labels, value in series.items():
                point = points.get((spec, labels))
                if point is None:
                    if container is None:
                        container = self._container(spec)
                    point = container.data_points.add()
                    point.attributes.extend(
                        [key_value(k, v) for k, v in zip(spec.labels, labels, strict=True)])
                    point.start_time_unix_nano = self._start_unix_nano
                    points[(spec, labels)] = point
                point.time_unix_nano = now
                point.as_double = value
                seen += 1
        if seen != len(points):  # a series vanished: never resend its stale value
            self._reset()
            return self.build(snapshot)
        return self._request


class OtlpMetricsPusher:
    """Sends the newest snapshot to ``<collector>/v1/metrics`` off the polling thread."""

    def __init__(
        self,
        collector_url: str,
        *,
        node: str,
        start_unix_nano: int,
        client: HttpClient,
        auth_token: str | None = None,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self._url = collector_url.rstrip("/") + OTLP_METRICS_PATH
        self._builder = OtlpRequestBuilder(node=node, start_unix_nano=start_unix_nano)
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
        self._last_ok = True

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
        """Export one snapshot now; True on a 2xx answer. Never raises. Logs only when
        the outcome changes (first failure, recovery), not on every push."""
        problem: str | None = None
        try:
            body = self._builder.build(snapshot).SerializeToString()
            response = self._client.post(self._url, content=body, headers=self._headers)
            if not 200 <= response.status_code < 300:
                problem = f"HTTP {response.status_code}"
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
        if problem is None:
            if self.failed and not self._last_ok:
                logger.info("OTLP metrics push to %s recovered", self._url)
            self.sent += 1
            self._last_ok = True
            return True
        if self._last_ok:
            logger.warning("OTLP metrics push to %s failed (%s); counting failures in %s",
                           self._url, problem, mn.AGENT_OTLP_PUSH_ERRORS.series)
        self._last_ok = False
        self.failed += 1
        if self._on_error is not None:
            self._on_error()
        return False

    def shutdown(self) -> None:
        """Send what is pending, then stop (idempotent)."""
        thread = self._thread
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if thread is not None:
            thread.join()
            self._thread = None
