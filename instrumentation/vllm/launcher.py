"""Start a real vLLM (CPU build) on loopback, serving the tiny test model, with its OTLP
traces and tokenpath's stat-logger plugin pointed at a tokenpath collector.

Used by the integration test and by ``tokenpath demo --engine vllm``::

    vllm = start_local_vllm(LocalVllmConfig(otlp_endpoint="127.0.0.1:4317"))
    try:
        ...  # OpenAI API at vllm.base_url, model name vllm.model_name
    finally:
        vllm.stop()

vLLM lives in its own virtual environment (``scripts/vllm_env.sh``; vLLM pins its own
torch and friends), so everything here runs it as a subprocess.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tokenpath.config import AT_LEAST_ONE, check, parse_host_port, validate_fields
from tokenpath.instrumentation.vllm.config import ENV_ENDPOINT
from tokenpath.instrumentation.vllm.tiny_model import MODEL_NAME, is_built

REPO_ROOT = Path(__file__).resolve().parents[2]
ENV_SCRIPT = REPO_ROOT / "scripts" / "vllm_env.sh"
ENV_VLLM_PYTHON = "TOKENPATH_VLLM_PYTHON_BIN"
DEFAULT_CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tokenpath"
DEFAULT_MODEL_DIR = DEFAULT_CACHE_DIR / "tiny-llama"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_KV_CACHE_GIB = 1
DEFAULT_STARTUP_TIMEOUT_SECONDS = 300.0
DEFAULT_ENV_TIMEOUT_SECONDS = 1200.0
STOP_GRACE_SECONDS = 15.0
# vLLM exports its spans through OpenTelemetry's BatchSpanProcessor, whose default 5 s
# delay is longer than the collector's root grace period: a gateway root span would be
# finalized before the engine's llm_request arrived. Export promptly instead.
DEFAULT_BSP_SCHEDULE_DELAY_MS = "200"
HEALTH_POLL_SECONDS = 1.0
LOG_TAIL_BYTES = 4000


class VllmUnavailable(RuntimeError):
    """vLLM could not be installed, built for, or started; the message says why."""


@dataclass(frozen=True, slots=True)
class LocalVllmConfig:
    """``otlp_endpoint``: collector OTLP/gRPC ``HOST:PORT`` for vLLM's own spans and the
    plugin (``None``: no tracing). ``port`` 0 picks a free one. ``extra_args`` are
    appended to vLLM's command line. ``extra_env`` is added to vLLM's environment."""

    otlp_endpoint: str | None = None
    host: str = DEFAULT_HOST
    port: int = field(default=0, metadata=check(ge=0, le=65535,
                                                message="out of range: {value}"))
    model_dir: Path = DEFAULT_MODEL_DIR
    served_model_name: str = MODEL_NAME
    kv_cache_space_gib: int = field(default=DEFAULT_KV_CACHE_GIB, metadata=AT_LEAST_ONE)
    # Eager mode skips torch.compile warm-up: startup ~30 s instead of ~100 s on 2 cores
    # for the tiny model (measured); a tiny model gains nothing from compilation.
    enforce_eager: bool = True
    startup_timeout_seconds: float = field(default=DEFAULT_STARTUP_TIMEOUT_SECONDS,
                                           metadata=check(gt=0, message="must be positive"))
    log_path: Path | None = None
    extra_args: tuple[str, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)

    def validate(self) -> LocalVllmConfig:
        if self.otlp_endpoint is not None:
            parse_host_port(self.otlp_endpoint, "otlp_endpoint")
        validate_fields(self)
        return self


class LocalVllm:
    """A running vLLM server process group; :meth:`stop` is idempotent."""

    def __init__(self, process: subprocess.Popen[bytes], base_url: str, model_name: str,
                 log_path: Path, log_file: IO[bytes]) -> None:
        self.process = process
        self.base_url = base_url
        self.model_name = model_name
        self.log_path = log_path
        self._log_file = log_file

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        """SIGTERM the server's process group (API server and engine core), SIGKILL after
        a grace period."""
        if self.process.poll() is None:
            _signal_group(self.process, signal.SIGTERM)
            try:
                self.process.wait(STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                _signal_group(self.process, signal.SIGKILL)
                self.process.wait(STOP_GRACE_SECONDS)
        # Engine-core children may outlive the API server by a moment.
        _signal_group(self.process, signal.SIGKILL)
        if not self._log_file.closed:
            self._log_file.close()

    def log_tail(self) -> str:
        return _tail(self.log_path)


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-LOG_TAIL_BYTES:].decode("utf-8", "replace")


def free_port(host: str = DEFAULT_HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def ensure_vllm_env(timeout_seconds: float = DEFAULT_ENV_TIMEOUT_SECONDS) -> Path:
    """The vLLM venv's python: ``$TOKENPATH_VLLM_PYTHON_BIN`` when set, else whatever
    ``scripts/vllm_env.sh`` installs or finds cached."""
    preset = os.environ.get(ENV_VLLM_PYTHON)
    if preset:
        return Path(preset)
    if not ENV_SCRIPT.exists():
        raise VllmUnavailable(
            f"{ENV_SCRIPT} not found: set {ENV_VLLM_PYTHON} to a python that has vLLM and "
            "tokenpath installed"
        )
    try:
        done = subprocess.run(["bash", str(ENV_SCRIPT)], capture_output=True,
                              timeout=timeout_seconds, check=False)
    except subprocess.TimeoutExpired as exc:
        raise VllmUnavailable(f"vllm_env.sh took over {timeout_seconds:.0f} s") from exc
    if done.returncode != 0:
        raise VllmUnavailable(
            "vllm_env.sh failed:\n" + done.stderr.decode("utf-8", "replace")[-LOG_TAIL_BYTES:]
        )
    return Path(done.stdout.decode().strip().splitlines()[-1])


def ensure_tiny_model(python: Path, model_dir: Path = DEFAULT_MODEL_DIR) -> Path:
    """Build the tiny model with the vLLM venv's ``python`` unless already cached."""
    if is_built(model_dir):
        return model_dir
    done = subprocess.run(
        [str(python), "-m", "tokenpath.instrumentation.vllm.tiny_model", str(model_dir)],
        capture_output=True, check=False,
    )
    if done.returncode != 0 or not is_built(model_dir):
        raise VllmUnavailable(
            "building the tiny model failed:\n"
            + done.stderr.decode("utf-8", "replace")[-LOG_TAIL_BYTES:]
        )
    return model_dir


def vllm_command(python: Path, config: LocalVllmConfig, port: int) -> list[str]:
    command = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(config.model_dir),
        "--served-model-name", config.served_model_name,
        "--host", config.host, "--port", str(port),
        "--dtype", "float32",
        "--enable-prefix-caching",
    ]
    if config.enforce_eager:
        command.append("--enforce-eager")
    if config.otlp_endpoint is not None:
        command += ["--otlp-traces-endpoint", config.otlp_endpoint,
                    "--collect-detailed-traces", "all"]
    return command + list(config.extra_args)


def start_local_vllm(config: LocalVllmConfig | None = None,
                     python: Path | None = None) -> LocalVllm:
    """Install or reuse the vLLM venv, build or reuse the tiny model, start vLLM and wait
    until ``/health`` answers. Raises :class:`VllmUnavailable` with the log's tail."""
    config = (config or LocalVllmConfig()).validate()
    python = python or ensure_vllm_env()
    ensure_tiny_model(python, config.model_dir)
    port = config.port or free_port(config.host)
    log_path = config.log_path or DEFAULT_CACHE_DIR / f"vllm-{port}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(config.kv_cache_space_gib),
           **config.extra_env}
    if config.otlp_endpoint is not None:
        env.setdefault(ENV_ENDPOINT, config.otlp_endpoint)
        env.setdefault("OTEL_BSP_SCHEDULE_DELAY", DEFAULT_BSP_SCHEDULE_DELAY_MS)
    log_file = log_path.open("wb")
    process = subprocess.Popen(vllm_command(python, config, port), stdout=log_file,
                               stderr=subprocess.STDOUT, env=env, start_new_session=True,
                               cwd=str(log_path.parent))
    handle = LocalVllm(process, f"http://{config.host}:{port}", config.served_model_name,
                       log_path, log_file)
    deadline = time.monotonic() + config.startup_timeout_seconds
    while time.monotonic() < deadline:
        if not handle.alive():
            handle.stop()
            raise VllmUnavailable(f"vLLM exited during startup:\n{handle.log_tail()}")
        try:
            with urllib.request.urlopen(f"{handle.base_url}/health", timeout=2) as reply:
                if reply.status == 200:
                    return handle
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(HEALTH_POLL_SECONDS)
    handle.stop()
    raise VllmUnavailable(
        f"vLLM not healthy after {config.startup_timeout_seconds:.0f} s:\n{handle.log_tail()}"
    )
