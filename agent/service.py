"""The node agent: poll loop, Prometheus listener and OTLP push, wired from a config.

``AgentService(config, nvml=..., sysfs_root=..., clock=..., http_client=...)`` builds the
samplers with the injected dependencies; ``start()`` takes a first poll, starts the
listener, the poll thread and the pusher; ``shutdown()`` (idempotent) stops polling,
flushes a last push and releases NVML.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from tokenpath.agent.config import AgentConfig
from tokenpath.agent.engine_scraper import EngineScraper
from tokenpath.agent.http_fetch import HttpClient, KeepAliveHttpClient
from tokenpath.agent.http_server import AgentHttpServer
from tokenpath.agent.kv_index import KvTracker
from tokenpath.agent.kv_receiver import KvEventReceiver
from tokenpath.agent.nic_sampler import NetIoCounters, NicSampler
from tokenpath.agent.node_poller import NodePoller
from tokenpath.agent.nvml_sampler import NvmlSampler
from tokenpath.agent.otlp_push import OtlpMetricsPusher
from tokenpath.agent.prom_collector import AgentCollector
from tokenpath.agent.snapshot import Snapshot
from tokenpath.build_metrics import BuildInfoCollector
from tokenpath.endpoints import host_port
from tokenpath.install_check import build_state, log_fallbacks
from tokenpath.labels import BoundedLabel

logger = logging.getLogger(__name__)


class _DefaultNvml:
    """Sentinel: import ``pynvml`` (nvidia-ml-py) at construction."""


DEFAULT_NVML: Any = _DefaultNvml()


def load_pynvml() -> Any | None:
    """The real ``pynvml`` module, or ``None`` when nvidia-ml-py is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


class AgentService:
    def __init__(
        self,
        config: AgentConfig,
        *,
        nvml: Any = DEFAULT_NVML,
        sysfs_root: Path | None = None,
        net_io_counters: NetIoCounters | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock_ns: Callable[[], int] = time.time_ns,
        http_client: HttpClient | None = None,
        registry: CollectorRegistry | None = None,
        auth_token: str | None = None,
    ) -> None:
        self.config = config.validate()
        self._owns_client = http_client is None
        self._client: HttpClient = http_client or KeepAliveHttpClient(
            config.engine_timeout_seconds)
        self._clock = clock
        self._auth_token = auth_token
        self.nvml_sampler = NvmlSampler(
            load_pynvml() if isinstance(nvml, _DefaultNvml) else nvml, clock,
            retry_seconds=config.nvml_retry_seconds, pcie_throughput=config.pcie_throughput,
        )
        nic_sampler = NicSampler(source=config.nic_source,
                                 sysfs_root=sysfs_root or Path(config.sysfs_root),
                                 exclude=config.nic_exclude, net_io_counters=net_io_counters)
        engines = (
            EngineScraper(config.engine_metrics_urls, self._client,
                          model_label=BoundedLabel(config.max_models))
            if config.engine_metrics_urls else None
        )
        self.kv_tracker: KvTracker | None = None
        self.kv_receiver: KvEventReceiver | None = None
        if config.kv_events:
            self.kv_tracker = KvTracker(models=config.kv_event_models,
                                        max_blocks=config.kv_max_blocks,
                                        max_engines=config.max_sources)
            self.kv_receiver = KvEventReceiver(config.kv_endpoints, self.kv_tracker,
                                               replay=config.kv_events_replay)
        self.poller = NodePoller(
            nvml_sampler=self.nvml_sampler, nic_sampler=nic_sampler, engine_scraper=engines,
            clock=clock, wall_clock_ns=wall_clock_ns, max_devices=config.max_devices,
            max_sources=config.max_sources, engine_interval=config.engine_interval_seconds,
            kv_tracker=self.kv_tracker,
        )
        self.registry = registry if registry is not None else CollectorRegistry()
        self._collector = AgentCollector(lambda: self._latest)
        self.build = build_state()
        self._build_info = BuildInfoCollector(self.build)
        self._latest: Snapshot | None = None
        self._rendered: tuple[Snapshot | None, bytes] | None = None
        self._pusher: OtlpMetricsPusher | None = None
        self._push_client: HttpClient | None = None
        if config.collector_url:
            push_tls = config.collector_tls
            self._push_client = KeepAliveHttpClient(
                config.push_timeout_seconds,
                ssl_context=push_tls.client_context() if push_tls.configured else None)
            self._pusher = OtlpMetricsPusher(
                config.collector_url, node=config.node, start_unix_nano=wall_clock_ns(),
                client=self._push_client,
                auth_token=auth_token, on_error=self._count_push_error,
            )
        self._server: AgentHttpServer | None = None
        self._stop = threading.Event()
        self._loop: threading.Thread | None = None
        self._started = False
        self._shut_down = False
        self._nvml_started = False

    # -- lifecycle ---------------------------------------------------------------------
    def start(self, *, serve: bool = True) -> None:
        """First poll, then the listener (when ``serve``), poll thread and pusher."""
        if self._started:
            return
        self._started = True
        self.registry.register(self._collector)
        self.registry.register(self._build_info)
        logger.info("agent: %s", self.build.describe())
        log_fallbacks(self.build, "agent")
        if self.kv_receiver is not None:
            self.kv_receiver.start()  # raises ConfigError naming kv_events
        self.poll_once()
        if serve:
            host, port = self.config.listen_address
            tls = self.config.tls
            self._server = AgentHttpServer(host, port, self.render_metrics,
                                           auth_token=self._auth_token,
                                           tls=tls.server_context() if tls.enabled else None)
            self._server.start()
        if self._pusher is not None:
            self._pusher.start()
            if self._latest is not None:
                self._pusher.submit(self._latest)
        self._loop = threading.Thread(target=self._run, name="tokenpath-agent-poll",
                                      daemon=True)
        self._loop.start()

    @staticmethod
    def settle_heap() -> None:
        """Collects the start-up garbage once and freezes what survives (``gc.freeze``),
        for the process that runs the agent, after :meth:`start`.

        Importing the agent's libraries leaves ~50k tracked objects. Left alone, the
        first full collection after start walks all of them (about 90 ms of CPU here);
        frozen, later collections only see what the agent allocates while it runs. Not
        called by :meth:`start` itself: freezing is a choice for the whole process, so
        an application embedding the agent makes it."""
        gc.collect()
        gc.freeze()

    def shutdown(self) -> None:
        """Stop polling, flush the newest snapshot to the collector, release NVML."""
        if self._shut_down:
            return
        self._shut_down = True
        self._stop.set()
        if self._loop is not None:
            self._loop.join()
        if self._server is not None:
            self._server.shutdown()
        if self._pusher is not None:
            if self._latest is not None:
                self._pusher.submit(self._latest)  # flush the newest poll
            self._pusher.shutdown()
        if self._push_client is not None:
            self._push_client.close()
        if self.kv_receiver is not None:
            self.kv_receiver.shutdown()
        if self._started:
            self.registry.unregister(self._collector)
            self.registry.unregister(self._build_info)
        self.poller.shutdown()
        self.nvml_sampler.shutdown()
        if self._owns_client:
            self._client.close()

    # -- polling -----------------------------------------------------------------------
    def poll_once(self) -> Snapshot:
        """Take one poll now and make it the one /metrics and the pusher serve."""
        if not self._nvml_started:
            self._nvml_started = True
            self.nvml_sampler.start()
        snapshot = self.poller.poll()
        self._latest = snapshot
        return snapshot

    def _run(self) -> None:
        interval = self.config.interval_seconds
        push_interval = self.config.push_interval_seconds
        next_poll = self._clock() + interval
        next_push = self._clock() + push_interval
        while not self._stop.wait(max(0.0, next_poll - self._clock())):
            try:
                snapshot = self.poll_once()
            except Exception:
                logger.exception("agent poll failed")
            else:
                if self._pusher is not None and self._clock() >= next_push:
                    self._pusher.submit(snapshot)
                    next_push = self._clock() + push_interval
            next_poll += interval
            now = self._clock()
            if next_poll < now:  # fell behind: skip missed ticks rather than burst
                next_poll = now + interval

    def render_metrics(self) -> bytes:
        """Prometheus text of the agent's registry, rendered once per poll: scrapes
        between two polls (HA Prometheus pairs, curl) get the same bytes."""
        latest = self._latest
        cached = self._rendered
        if cached is not None and cached[0] is latest:
            return cached[1]
        body = generate_latest(self.registry)
        self._rendered = (latest, body)
        return body

    def _count_push_error(self) -> None:
        self.poller.push_errors += 1

    @property
    def latest(self) -> Snapshot | None:
        return self._latest

    @property
    def listen_port(self) -> int | None:
        return self._server.port if self._server is not None else None

    @property
    def metrics_url(self) -> str | None:
        """Where /metrics is served (``https`` with TLS), once started."""
        if self._server is None:
            return None
        return f"{self._server.scheme}://{host_port(self._server.host, self._server.port)}/metrics"

    @property
    def pusher(self) -> OtlpMetricsPusher | None:
        return self._pusher
