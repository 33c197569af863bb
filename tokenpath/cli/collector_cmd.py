"""``tokenpath collector``: OTLP in, requests joined, Prometheus and store out."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from types import FrameType

import typer

from tokenpath.cli.common import auth_token, console, fail
from tokenpath.config import ConfigError, load_config_file
from tokenpath.endpoints import COLLECTOR_GRPC, COLLECTOR_HTTP


def register(app: typer.Typer) -> None:
    @app.command("collector")
    def collector(
        grpc: str | None = typer.Option(None, help="OTLP/gRPC HOST:PORT ('off' to disable). "
                                        f"Default {COLLECTOR_GRPC}."),
        http: str | None = typer.Option(None, help="OTLP/HTTP, API and UI HOST:PORT. "
                                        f"Default {COLLECTOR_HTTP}."),
        store: str | None = typer.Option(None, help="SQLite store path, or chdb:///PATH, "
                                         "clickhouse[s]://[USER@]HOST[:PORT]/DB (password: "
                                         "$TOKENPATH_CLICKHOUSE_PASSWORD[_FILE]). Default "
                                         "$TOKENPATH_STORE or ~/.local/share/tokenpath/store.db."),
        prices: str | None = typer.Option(None, help="Price sheet YAML."),
        config: Path | None = typer.Option(None, help="Collector config YAML."),
        auth_token_file: Path | None = typer.Option(None, help="File holding the bearer token."),
        tls_cert: str | None = typer.Option(None, help="PEM server certificate: TLS on both "
                                            "listeners (with --tls-key)."),
        tls_key: str | None = typer.Option(None, help="PEM private key of --tls-cert."),
        tls_client_ca: str | None = typer.Option(None, help="PEM CA: require client "
                                                 "certificates signed by it (mTLS)."),
        forward_records: str | None = typer.Option(
            None, help="OTLP/HTTP logs URL (.../v1/logs): export mapped records there to be "
                       "priced (sharded collectors, docs/deploy.md) instead of pricing here."),
        log_level: str = typer.Option("info", help="Logging level."),
    ) -> None:
        """Run the collector until interrupted (SIGINT/SIGTERM flush and exit cleanly)."""
        from tokenpath.collector.config import CollectorConfig
        from tokenpath.collector.gc_tuning import tune_gc
        from tokenpath.collector.service import CollectorService
        from tokenpath.collector.store.url import is_clickhouse_url, parse_url

        logging.basicConfig(level=log_level.upper(),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        try:
            cfg = CollectorConfig.from_sources(
                http=http, grpc=grpc, store=store, prices=prices,
                auth_token=auth_token(auth_token_file), tls_cert=tls_cert, tls_key=tls_key,
                tls_client_ca=tls_client_ca, forward_records=forward_records,
                file=load_config_file(config),
            )
            if is_clickhouse_url(cfg.store_path):
                target = parse_url(cfg.store_path)
                if target.chdb:
                    Path(target.path).parent.mkdir(parents=True, exist_ok=True)
            elif cfg.store_path != ":memory:":
                Path(cfg.store_path).expanduser().parent.mkdir(parents=True, exist_ok=True)
            service = CollectorService(cfg)
            service.start()
        except ConfigError as exc:
            fail(str(exc))
        tune_gc(cfg.gc_young_threshold)  # this process is the collector's alone
        console.print(f"tokenpath collector: OTLP/HTTP, API and UI on {service.http_url}"
                      + (f", OTLP/gRPC on {service.grpc_endpoint}" if service.grpc else "")
                      + f"; store {cfg.store_path}"
                      + (f"; forwarding records to {cfg.forward_records}"
                         if cfg.forward_records else ""), highlight=False)
        stop = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            del signum, frame
            stop.set()

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        stop.wait()
        console.print("tokenpath collector: flushing and shutting down", highlight=False)
        service.shutdown()
