#!/usr/bin/env bash
# Create (or reuse) the virtual environment of the real GenAI client packages that
# tokenpath's integration tests drive (tests/integration/test_genai_packages.py): the
# openai client under opentelemetry-instrumentation-openai-v2, traceloop-sdk
# (OpenLLMetry) and litellm's proxy with its otel callback. They pin OpenTelemetry and
# HTTP packages of their own, so they live apart from tokenpath's venv; the tests run them
# as subprocesses that export OTLP to a tokenpath collector. Idempotent and cached (about
# 80 s on a fresh machine). Prints the venv's python path as its last line.
#
# Environment:
#   TOKENPATH_GENAI_VENV    where the venv lives (default ~/.cache/tokenpath/genai-venv)
#   TOKENPATH_GENAI_PYTHON  interpreter that creates the venv (default python3.11)
set -euo pipefail

VENV="${TOKENPATH_GENAI_VENV:-$HOME/.cache/tokenpath/genai-venv}"
PYTHON="${TOKENPATH_GENAI_PYTHON:-python3.11}"
STAMP="$VENV/.tokenpath-genai-stamp"
# Pinned: the tests assert on the span names and attributes these versions emit.
PACKAGES=(
  "openai==3.57.0"
  "opentelemetry-instrumentation-openai-v2==2.4b0"
  "opentelemetry-util-genai==0.4b0"  # openai-v2 2.4b0 breaks on util-genai >= 1
  "traceloop-sdk==0.62.3"
  "litellm[proxy]==1.108.7"
  "opentelemetry-sdk>=1.30"
  "opentelemetry-exporter-otlp-proto-http>=1.30"
)

log() { echo "[genai_env] $*" >&2; }

wanted="python=$PYTHON ${PACKAGES[*]}"
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$wanted" ]]; then
  start=$(date +%s)
  log "installing the GenAI client packages into $VENV"
  rm -f "$STAMP"
  test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --disable-pip-version-check -q --upgrade pip
  "$VENV/bin/python" -m pip install --disable-pip-version-check -q "${PACKAGES[@]}"
  "$VENV/bin/python" -c "import openai, litellm, traceloop.sdk, \
opentelemetry.instrumentation.openai_v2" >&2
  echo "$wanted" >"$STAMP"
  log "installed in $(($(date +%s) - start)) s"
fi

echo "$VENV/bin/python"
