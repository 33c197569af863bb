"""``tokenpath demo``: the reference serving path, collector, agent and a workload, on loopback.

Starts the collector (in-process, loopback), the reference serving path of docs/architecture.md
(a simulated engine behind a real gateway, instrumented with tokenpath's shims and
exporting OTLP to the collector; or, with ``--engine vllm``, a local CPU vLLM behind the
same gateway) and the node agent scraping the engine's metrics; drives a chat workload
with shared system prompts, multi-turn continuations and a long-context tail while
showing progress, then prints the per-stage report. Ctrl-C stops the workload early and
still prints the report.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import signal
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from tokenpath.cli.common import auth_token, console, fail
from tokenpath.config import (
    ConfigError,
    check,
    load_config_file,
    parse_host_port,
    validate_fields,
)
from tokenpath.endpoints import AGENT_LISTEN, COLLECTOR_HTTP
from tokenpath.instrumentation.tenants import TenantConfig
from tokenpath.slo import CONFIG_KEY as SLO_CONFIG_KEY
from tokenpath.slo import SloClass, SloConfig, scaled

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from tokenpath.agent.service import AgentService
    from tokenpath.collector.cost.attributor import NodeLedger
    from tokenpath.collector.service import CollectorService
    from tokenpath.instrumentation.reference.driver import DriveStats
    from tokenpath.instrumentation.reference.workload import WorkloadGenerator
    from tokenpath.records import RequestRecord
    from tokenpath.report import Report

DEFAULT_COLLECTOR_HTTP = COLLECTOR_HTTP
DEFAULT_AGENT_LISTEN = AGENT_LISTEN
# The loopback endpoint the demo's agent binds for its replicas' KV-cache events (a port
# the kernel picks free at start).
DEMO_KV_EVENTS_HOST = "127.0.0.1"
DEFAULT_RPS = 4.0
DEFAULT_TIME_SCALE = 1.0
DEFAULT_SHARED_PREFIX = 0.7
DEFAULT_DEMO_GPU = "H100-SXM"
DEFAULT_DEMO_MODEL = "llama-3.1-70b"
DEFAULT_DEMO_TENSOR_PARALLEL = 4  # 70B in BF16 (141 GB of weights) over 4 x 80 GB
DEFAULT_SEED = 7
EXPORT_FLUSH_MILLIS = 10_000
# The leaks made material (docs/demo.md): replicas behind a round-robin router miss each
# other's prefixes, a KV cache of 2,560 blocks (40,960 tokens) per replica evicts them
# under the long-context tail, and the gateway writes a packet per streamed token.
DEFAULT_DEMO_REPLICAS = 3
DEFAULT_DEMO_ROUTER = "round_robin"
DEFAULT_DEMO_KV_BLOCKS = 2_560
DEFAULT_TOKENS_PER_WRITE = 1
DEMO_ROUTERS = ("round_robin", "prefix_affine")
# The demo's tenants and the share of requests each sends; each gets an API key drawn
# per run, mapped to its name by the gateway shim's key table. One more key (the rest of
# the traffic) is in no table: the shim names it by a salted hash of the key.
DEMO_TENANTS = (("acme", 0.5), ("globex", 0.3), ("initech", 0.15))
DEMO_UNMAPPED_KEY_WEIGHT = 0.05
# The demo's SLO classes, at time scale 1 (their targets scale with --time-scale, as the
# engine's clock does): acme's traffic is interactive, held to a tight time to first
# token (about a third of it misses on the default demo); the rest is batch, held to
# loose targets.
DEMO_SLO_CLASSES = SloConfig((
    SloClass("interactive", ttft_seconds=0.5, tpot_seconds=0.1, objective=0.99,
             tenant="acme"),
    SloClass("batch", ttft_seconds=5.0, e2e_seconds=60.0, objective=0.95),
))


@dataclass(frozen=True, slots=True)
class DemoTenants:
    keys: tuple[tuple[str, float], ...]  # (API key, share of requests)
    config: TenantConfig

    @classmethod
    def draw(cls) -> DemoTenants:
        mapped = {f"sk-demo-{secrets.token_urlsafe(18)}": name for name, _ in DEMO_TENANTS}
        unmapped = f"sk-demo-{secrets.token_urlsafe(18)}"
        weights = dict(DEMO_TENANTS)
        keys = (*((key, weights[name]) for key, name in mapped.items()),
                (unmapped, DEMO_UNMAPPED_KEY_WEIGHT))
        return cls(keys, TenantConfig(key_tenants=mapped,
                                      hash_salt=secrets.token_hex(16)))


class EngineKind(StrEnum):
    SIMULATED = "simulated"
    VLLM = "vllm"


def _at_least_one(key: str | None = None) -> Mapping[str, Any]:
    return check(ge=1, key=key, message="must be at least 1")


@dataclass(frozen=True, slots=True)
class DemoConfig:
    duration: float | None = field(metadata=check(
        gt=0, optional=True, message="must be greater than 0"))
    rps: float = field(metadata=check(gt=0, message="must be greater than 0"))
    store_path: str
    ground_truth: Path | None
    collector_host: str
    collector_port: int
    time_scale: float = field(default=DEFAULT_TIME_SCALE, metadata=check(
        gt=0, key="time-scale", message="must be greater than 0"))
    shared_prefix: float = field(default=DEFAULT_SHARED_PREFIX,
                                 metadata=check(ge=0.0, le=1.0, key="shared-prefix"))
    replicas: int = field(default=DEFAULT_DEMO_REPLICAS, metadata=_at_least_one())
    gpu: str = DEFAULT_DEMO_GPU
    model: str = DEFAULT_DEMO_MODEL
    tensor_parallel: int = DEFAULT_DEMO_TENSOR_PARALLEL
    seed: int = DEFAULT_SEED
    prices_path: str | None = None
    engine: EngineKind = EngineKind.SIMULATED
    agent_listen: str = DEFAULT_AGENT_LISTEN
    router: str = field(default=DEFAULT_DEMO_ROUTER, metadata=check(one_of=DEMO_ROUTERS))
    kv_blocks: int = field(default=DEFAULT_DEMO_KV_BLOCKS, metadata=_at_least_one("kv-blocks"))
    tokens_per_write: int = field(default=DEFAULT_TOKENS_PER_WRITE,
                                  metadata=_at_least_one("tokens-per-write"))
    # SLO classes at time scale 1 (the collector runs them scaled by time_scale).
    slo: SloConfig = DEMO_SLO_CLASSES
    disaggregated: bool = False  # a prefill pool and a decode pool of --replicas each

    def validate(self) -> None:
        validate_fields(self)  # errors name the command-line options
        if self.engine is EngineKind.VLLM and self.ground_truth is not None:
            raise ConfigError("ground-truth", "only the simulated engine knows its ground truth")
        if self.engine is EngineKind.VLLM and self.disaggregated:
            raise ConfigError("disaggregated", "runs the simulated engine's prefill and "
                              "decode pools")
        self.slo.validate()

    @property
    def collector_slo(self) -> SloConfig:
        """The classes the collector runs: the simulated engine's clock is scaled."""
        if self.engine is EngineKind.SIMULATED and self.time_scale != 1.0:
            return scaled(self.slo, self.time_scale)
        return self.slo


def _tracer_provider(collector_url: str, token: str | None) -> TracerProvider:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    from tokenpath.instrumentation.otlp_exporter import (
        TokenpathBatchSpanProcessor,
        TokenpathOTLPSpanExporter,
    )

    headers = {"Authorization": f"Bearer {token}"} if token else None
    provider = TracerProvider(resource=Resource.create({"service.name": "tokenpath-demo"}),
                              shutdown_on_exit=False)
    exporter = TokenpathOTLPSpanExporter(endpoint=f"{collector_url}/v1/traces",
                                         headers=headers, timeout=10)
    provider.add_span_processor(TokenpathBatchSpanProcessor(
        exporter, schedule_delay_millis=500, max_queue_size=1 << 15))
    return provider


def _progress_text(stats: DriveStats, duration: float | None) -> str:
    limit = f"/{duration:.0f}s" if duration else " (Ctrl-C to stop)"
    return (f"{stats.elapsed:5.1f}s{limit}  sent {stats.sent}  ok {stats.ok}  "
            f"failed {stats.failed}  "
            + (f"cancelled {stats.cancelled}  " if stats.cancelled else "")
            + f"in flight {stats.in_flight}  "
            f"chunks streamed {stats.output_chunks}")


@dataclass(frozen=True, slots=True)
class DemoResult:
    """This run's request records (as the collector built them) and their report."""

    records: list[RequestRecord]
    report: Report
    # per pricing unit (node): its GPU dollars, attributed and idle (the collector's)
    ledger: dict[str, NodeLedger] = dataclasses.field(default_factory=dict)


def _interruptible() -> None:
    """Ctrl-C (SIGINT) stops the workload and prints the report, however the demo was
    started: a shell runs a background job (``tokenpath demo &``, a script's ``cmd &``)
    with SIGINT ignored, and ``kill -INT`` would then be lost."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def run_demo(config: DemoConfig, out: Console) -> DemoResult:
    """Run the demo and print its report (also usable from benchmarks and tests)."""
    config.validate()
    _interruptible()
    started_unix = time.time()
    token = auth_token()
    collector = _start_collector(config, token)
    provider = _tracer_provider(collector.http_url, token)
    try:
        if config.engine is EngineKind.VLLM:
            _serve_vllm(config, collector, provider, out)
        else:
            _serve_simulated(config, collector, provider, out)
    except BaseException:
        collector.shutdown()
        raise
    finally:
        provider.force_flush(EXPORT_FLUSH_MILLIS)
        provider.shutdown()
    return _report_and_stop(collector, config, out, started_unix)


def _start_collector(config: DemoConfig, token: str | None) -> CollectorService:
    from tokenpath.collector.config import CollectorConfig
    from tokenpath.collector.service import CollectorService

    store_path = Path(config.store_path).expanduser()
    store_path.parent.mkdir(parents=True, exist_ok=True)
    # vLLM exports its spans over OTLP/gRPC; the simulated path uses OTLP/HTTP only
    grpc_port = 0 if config.engine is EngineKind.VLLM else None
    try:
        collector = CollectorService(CollectorConfig(
            http_host=config.collector_host, http_port=config.collector_port,
            grpc_host=config.collector_host, grpc_port=grpc_port, store_path=str(store_path),
            auth_token=token, prices_path=config.prices_path, slo=config.collector_slo,
        ))
    except ConfigError as exc:
        key = {"http": "collector-http", "store": "store"}.get(exc.key, exc.key)
        raise ConfigError(key, str(exc).removeprefix(f"{exc.key}: ")) from exc
    collector.start()
    return collector


def _banner_tail(collector: CollectorService, agent: AgentService | None, agent_note: str,
                 out: Console) -> None:
    out.print(f"  collector {collector.http_url} (OTLP/HTTP /v1/traces, /metrics)")
    out.print(f"  UI        {collector.http_url}/")
    if agent is not None:
        host = agent.config.listen_address[0]
        out.print(f"  agent     http://{host}:{agent.listen_port}/metrics (scraping the engine "
                  "metrics, pushing to the collector)")
    else:
        out.print(f"  agent     not started: {agent_note}")


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _start_agent(config: DemoConfig, collector: CollectorService, engine_metrics_url: str,
                 kv_events: str | None = None, engines: tuple[str, ...] = (),
                 ) -> tuple[AgentService | None, str]:
    """The node agent on ``--agent-listen``, scraping the engine and pushing OTLP metrics
    to the collector; with ``kv_events``, receiving the ``engines``' KV-cache events there.
    A failure to start it is reported, never fatal to the demo."""
    from tokenpath.agent.config import AgentConfig
    from tokenpath.agent.service import AgentService

    try:
        agent_config = AgentConfig.from_sources(
            listen=config.agent_listen, collector_url=collector.http_url,
            engine_metrics_urls=[engine_metrics_url],
            kv_events=[kv_events] if kv_events else None)
        if kv_events:
            agent_config = dataclasses.replace(
                agent_config, kv_event_models=dict.fromkeys(engines, config.model)).validate()
        agent = AgentService(agent_config, auth_token=auth_token())
    except (ConfigError, OSError) as exc:
        return None, str(exc)
    try:
        agent.start()
    except (ConfigError, OSError) as exc:
        agent.shutdown()
        return None, f"--agent-listen {config.agent_listen}: {exc}"
    return agent, ""


def _serve_simulated(config: DemoConfig, collector: CollectorService,
                     provider: TracerProvider, out: Console) -> None:
    from tokenpath.collector.cost.prices import load_price_sheet
    from tokenpath.instrumentation.gateway import GatewayConfig
    from tokenpath.instrumentation.reference import SIMULATED_ENGINE_LABEL
    from tokenpath.instrumentation.reference.engine import EngineConfig
    from tokenpath.instrumentation.reference.gateway_parts import RoutingPolicy
    from tokenpath.instrumentation.reference.ground_truth import GroundTruthWriter
    from tokenpath.instrumentation.reference.serving_path import (
        ReferencePathConfig,
        ReferenceServingPath,
    )
    from tokenpath.instrumentation.reference.workload import DEMO_WORKLOAD, WorkloadGenerator

    truth = GroundTruthWriter(config.ground_truth) if config.ground_truth else None
    # the ground truth prices GPU time like the collector's price sheet does
    gpu_price = load_price_sheet(config.prices_path).gpu_price(config.gpu)
    # The replicas publish their KV-cache events as vLLM does, to an endpoint the agent
    # binds (docs/agent.md, "KV-cache events").
    kv_events = f"tcp://{DEMO_KV_EVENTS_HOST}:{_free_port(DEMO_KV_EVENTS_HOST)}"
    engine = EngineConfig(gpu=config.gpu, model=config.model,
                          tensor_parallel=config.tensor_parallel, time_scale=config.time_scale,
                          gpu_dollars_per_hour=gpu_price.dollars_per_hour,
                          kv_blocks=config.kv_blocks, kv_events_endpoint=kv_events)
    tenants = DemoTenants.draw()
    path = ReferenceServingPath(ReferencePathConfig(
        engine=engine, replicas=config.replicas, routing=RoutingPolicy(config.router),
        stream_tokens_per_chunk=config.tokens_per_write, disaggregated=config.disaggregated,
        api_keys=tuple(key for key, _ in tenants.keys),
        gateway=GatewayConfig(tenants=tenants.config)),
        tracer_provider=provider, ground_truth=truth)
    agent: AgentService | None = None
    try:
        path.start()
        agent, agent_note = _start_agent(
            config, collector, f"{path.base_url}/metrics", kv_events,
            tuple(engine.config.replica for engine in path.engines))
        replicas = (f"{config.replicas} prefill and {config.replicas} decode engines "
                    "(disaggregated, the KV sent over a simulated link)"
                    if config.disaggregated else f"{config.replicas} replicas")
        out.print(f"[bold]tokenpath demo[/] — reference serving path with a "
                  f"[yellow]{SIMULATED_ENGINE_LABEL}[/] ({config.model} on "
                  f"{config.tensor_parallel} x {config.gpu}, {replicas} "
                  f"behind a {config.router} router, {config.kv_blocks:,} KV blocks each, "
                  f"{config.tokens_per_write} token(s) per streamed write, "
                  f"time scale {config.time_scale:g})")
        out.print(f"  gateway   {path.base_url}/v1/chat/completions "
                  f"(engine metrics in vLLM format: {path.base_url}/metrics)")
        _banner_tail(collector, agent, agent_note, out)
        workload = WorkloadGenerator(dataclasses.replace(
            DEMO_WORKLOAD, seed=config.seed, shared_prefix=config.shared_prefix))
        _drive_with_progress(path.base_url, provider, workload, config, config.model, out,
                             tenants)
    finally:
        if agent is not None:
            agent.shutdown()
        path.shutdown()
        if truth is not None:
            truth.shutdown()


def _serve_vllm(config: DemoConfig, collector: CollectorService, provider: TracerProvider,
                out: Console) -> None:
    """A local vLLM (CPU, tiny test model, instrumentation/vllm/launcher.py) behind the reference
    gateway; vLLM exports its own spans to the collector over OTLP/gRPC."""
    from tokenpath.instrumentation.gateway import GatewayConfig, GatewayInstrumentor
    from tokenpath.instrumentation.reference.gateway_parts import ApiKeyAuth, TokenBucket
    from tokenpath.instrumentation.reference.serving_path import LoopbackServer
    from tokenpath.instrumentation.reference.upstream_gateway import (
        UpstreamGatewayParts,
        create_upstream_gateway,
    )
    from tokenpath.instrumentation.reference.workload import WorkloadConfig, WorkloadGenerator
    from tokenpath.instrumentation.vllm.launcher import LocalVllmConfig, start_local_vllm

    out.print("[bold]tokenpath demo[/] — starting a local vLLM on CPU with a tiny test model "
              "(the first run installs vLLM into its own environment: minutes)")
    try:
        vllm = start_local_vllm(LocalVllmConfig(otlp_endpoint=collector.grpc_endpoint))
    except Exception as exc:
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError("engine", f"vllm is not available here: {first_line}") from exc
    server: LoopbackServer | None = None
    agent: AgentService | None = None
    try:
        agent, agent_note = _start_agent(config, collector, f"{vllm.base_url}/metrics")
        app = create_upstream_gateway(UpstreamGatewayParts(
            upstream_urls=[vllm.base_url], auth=ApiKeyAuth(), rate_limit=TokenBucket(),
            model=vllm.model_name))
        tenants = DemoTenants.draw()
        GatewayInstrumentor().instrument_app(app, tracer_provider=provider,
                                             config=GatewayConfig(tenants=tenants.config))
        server = LoopbackServer(app)
        server.start()
        out.print(f"  gateway   {server.base_url}/v1/chat/completions -> vLLM {vllm.base_url} "
                  f"(model {vllm.model_name}, metrics {vllm.base_url}/metrics)")
        _banner_tail(collector, agent, agent_note, out)
        # the tiny test model has a 2,048-token context: a smaller workload of the same shape
        workload = WorkloadGenerator(WorkloadConfig(
            seed=config.seed, shared_prefix=config.shared_prefix, system_prompt_words=48,
            tool_definition_words=32, user_words=(4, 24), multi_turn_share=0.1,
            long_context_share=0.02, long_context_words=(60, 120), max_tokens=(8, 24)))
        _drive_with_progress(server.base_url, provider, workload, config, vllm.model_name,
                             out, tenants)
    finally:
        if agent is not None:
            agent.shutdown()
        if server is not None:
            server.shutdown()
        vllm.stop()


def _drive_with_progress(base_url: str, provider: TracerProvider, workload: WorkloadGenerator,
                         config: DemoConfig, model: str, out: Console,
                         tenants: DemoTenants) -> None:
    from tokenpath.instrumentation.client import InstrumentedClient
    from tokenpath.instrumentation.reference.driver import drive
    from tokenpath.instrumentation.reference.tokenizer import ToyTokenizer

    progress = Progress(TextColumn("[bold blue]workload"), BarColumn(),
                        TextColumn("{task.description}"), TimeElapsedColumn(),
                        console=out, transient=False)
    total = config.duration if config.duration else None
    task = progress.add_task("starting", total=total)

    def update(stats: DriveStats) -> None:
        progress.update(task, description=_progress_text(stats, config.duration),
                        completed=min(stats.elapsed, total) if total else stats.elapsed)

    async def main() -> None:
        client = InstrumentedClient(base_url, tracer_provider=provider,
                                    tokenize=ToyTokenizer().encode)
        try:
            await drive(client, workload, model, config.rps,
                        duration=config.duration, on_progress=update, seed=config.seed,
                        api_keys=tenants.keys)
        finally:
            await client.aclose()

    with progress:
        try:
            asyncio.run(main())
        except KeyboardInterrupt:
            out.print("[yellow]interrupted: stopping the workload and printing the report[/]")


def _report_and_stop(collector: CollectorService, config: DemoConfig, out: Console,
                     started_unix: float) -> DemoResult:
    """Flush the collector and print the report of this run's requests (the store may
    hold earlier runs too)."""
    from tokenpath import views
    from tokenpath.cli.render import (
        render_chargeback,
        render_disaggregated,
        render_leak_ranking,
        render_report,
    )
    from tokenpath.collector.cost.chargeback import IdlePolicy
    from tokenpath.collector.cost.prices import load_price_sheet
    from tokenpath.collector.store.factory import open_store_readonly
    from tokenpath.query import Window

    time.sleep(0.2)  # let the last OTLP export land
    collector.shutdown()  # flushes every buffered trace through the attributor to the store
    ledger = collector.attributor.ledger
    store = open_store_readonly(str(Path(config.store_path).expanduser()))
    window = Window(started_unix)
    try:
        records = store.records(since_unix=started_unix)  # this run's: the demo's own few
        report = views.report_view(store, window)
        ranked = views.rank_leaks_view(store, window, load_price_sheet(
            config.prices_path).network_dollars_per_byte) if report.requests else []
        rows = views.chargeback_view(store, window, IdlePolicy.PROPORTIONAL)
    finally:
        store.shutdown()
    out.print()
    render_report(report, out)
    if report.requests:
        out.print()
        render_leak_ranking(ranked, out)
        out.print()
        render_chargeback(rows, IdlePolicy.PROPORTIONAL, out)
    if config.disaggregated:
        out.print()
        render_disaggregated(records, out)
    out.print()
    # Lines naming paths and commands are not folded (soft_wrap): a path broken at the
    # console's width would not paste back whole.
    out.print(f"This run: {report.requests} request records, stored in {config.store_path}.",
              soft_wrap=True)
    # The collector suggested here listens where the demo's did, unless that was a free
    # port picked at random (0): then on the collector's default.
    from tokenpath.collector.config import DEFAULT_HTTP_HOST, DEFAULT_HTTP_PORT

    port = config.collector_port or DEFAULT_HTTP_PORT
    listen = ("" if (config.collector_host, port) == (DEFAULT_HTTP_HOST, DEFAULT_HTTP_PORT)
              else f" --http {config.collector_host}:{port}")
    out.print(f"Explore all stored runs: [bold]tokenpath report --store {config.store_path}[/]"
              ", or run "
              f"[bold]tokenpath collector --store {config.store_path}{listen}[/] and open the UI "
              f"at http://{config.collector_host}:{port}/", soft_wrap=True)
    if config.ground_truth:
        out.print(f"Ground truth (simulated engine's GPU seconds and dollars per request): "
                  f"{config.ground_truth}", soft_wrap=True)
    return DemoResult(records, report, ledger)


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        duration: float | None = typer.Option(
            None, help="Seconds to run (default: until Ctrl-C)."),
        rps: float = typer.Option(DEFAULT_RPS, help="Requests per second (Poisson arrivals)."),
        store: str | None = typer.Option(
            None, help="Store path (default $TOKENPATH_STORE or "
                       "~/.local/share/tokenpath/store.db)."),
        ground_truth: Path | None = typer.Option(
            None, "--ground-truth",
            help="Write the simulated engine's per-request GPU seconds and dollars (JSONL)."),
        collector_http: str = typer.Option(DEFAULT_COLLECTOR_HTTP, "--collector-http",
                                           help="Collector HTTP listener HOST:PORT."),
        agent_listen: str = typer.Option(DEFAULT_AGENT_LISTEN, "--agent-listen",
                                         help="Node agent listener HOST:PORT."),
        engine: EngineKind = typer.Option(
            EngineKind.SIMULATED, "--engine",
            help="simulated (built in), or vllm: a local vLLM on CPU with a tiny test model "
                 "(installed on first use)."),
        time_scale: float = typer.Option(
            DEFAULT_TIME_SCALE, "--time-scale",
            help="Multiply the simulated engine's step times (0.01 = 100x faster)."),
        shared_prefix: float = typer.Option(
            DEFAULT_SHARED_PREFIX, "--shared-prefix",
            help="Share of requests opening with a shared system prompt (0..1)."),
        replicas: int = typer.Option(DEFAULT_DEMO_REPLICAS,
                                     help="Engine replicas behind the router."),
        router: str = typer.Option(DEFAULT_DEMO_ROUTER, help="round_robin (prefixes miss "
                                   "across replicas) or prefix_affine."),
        kv_blocks: int = typer.Option(DEFAULT_DEMO_KV_BLOCKS, "--kv-blocks",
                                      help="KV-cache blocks (16 tokens) per replica."),
        tokens_per_write: int = typer.Option(DEFAULT_TOKENS_PER_WRITE, "--tokens-per-write",
                                             help="Tokens per streamed SSE write."),
        disaggregated: bool = typer.Option(
            False, "--disaggregated",
            help="Serve each request on two engines: prefill on one of --replicas prefill "
                 "engines, decode on one of as many decode engines (other nodes), the KV "
                 "cache sent between them over a simulated link."),
        gpu: str = typer.Option(DEFAULT_DEMO_GPU, help="GPU of the simulated engine."),
        model: str = typer.Option(DEFAULT_DEMO_MODEL, help="Model of the simulated engine."),
        tensor_parallel: int = typer.Option(DEFAULT_DEMO_TENSOR_PARALLEL, "--tensor-parallel"),
        seed: int = typer.Option(DEFAULT_SEED, help="Workload seed."),
        prices: str | None = typer.Option(
            None, help="Price sheet YAML for the collector and the ground truth "
                       "(default: the built-in sheet)."),
        slo_classes: Path | None = typer.Option(
            None, "--slo-classes",
            help="A YAML file whose slo_classes replace the demo's (interactive, batch); "
                 "targets at time scale 1."),
    ) -> None:
        """Run the reference serving path with a workload and print the stage report."""
        from tokenpath.collector.store.url import default_store_path

        try:
            host, port = parse_host_port(collector_http, "collector-http")
            parse_host_port(agent_listen, "agent-listen")  # checked here, bound later
            config = DemoConfig(
                duration=duration, rps=rps, store_path=store or default_store_path(),
                ground_truth=ground_truth, collector_host=host, collector_port=port,
                time_scale=time_scale, shared_prefix=shared_prefix, replicas=replicas,
                gpu=gpu, model=model, tensor_parallel=tensor_parallel, seed=seed,
                prices_path=prices, engine=engine, agent_listen=agent_listen,
                router=router, kv_blocks=kv_blocks, tokens_per_write=tokens_per_write,
                slo=(DEMO_SLO_CLASSES if slo_classes is None else SloConfig.from_file(
                    load_config_file(slo_classes).get(SLO_CONFIG_KEY))),
                disaggregated=disaggregated,
            )
            config.validate()
            from tokenpath.instrumentation.reference.engine import EngineConfig

            EngineConfig(gpu=gpu, model=model, tensor_parallel=tensor_parallel,
                         time_scale=time_scale).validate()
        except ConfigError as exc:
            fail(f"--{exc}")
        try:
            run_demo(config, console)
        except ConfigError as exc:
            fail(f"--{exc}")
