#!/usr/bin/env bash
# Create (or reuse) the virtual environment of one real GenAI client instrumentation that
# tokenpath's live vLLM tests drive (tests/integration/test_vllm_clients.py). Each lives
# apart: OpenInference wants openai 3.x, OpenLIT 1.45 resolves only with openai < 3 and the
# OpenTelemetry pins below (unpinned, pip backtracked for over 30 minutes). Idempotent and
# cached. Prints the venv's python path as its last line.
#
# Usage: client_env.sh openinference|openlit
# Environment:
#   TOKENPATH_CLIENT_VENV_DIR  where the venvs live (default ~/.cache/tokenpath)
#   TOKENPATH_CLIENT_PYTHON    interpreter that creates them (default python3.11)
set -euo pipefail

NAME="${1:?usage: client_env.sh openinference|openlit}"
DIR="${TOKENPATH_CLIENT_VENV_DIR:-$HOME/.cache/tokenpath}"
PYTHON="${TOKENPATH_CLIENT_PYTHON:-python3.11}"
COMMON=("opentelemetry-exporter-otlp-proto-http")
case "$NAME" in
  openinference)
    # Pinned: the tests assert on the spans these versions emit.
    PACKAGES=("openai==3.63.0" "openinference-instrumentation-openai==0.1.66"
              "opentelemetry-sdk>=1.30" "${COMMON[@]}")
    CHECK="import openai, openinference.instrumentation.openai" ;;
  openlit)
    PACKAGES=("openlit==1.45.0" "openai<3" "opentelemetry-sdk==1.40.0"
              "opentelemetry-instrumentation==0.61b0" "opentelemetry-exporter-otlp-proto-http==1.40.0")
    CHECK="import openai, openlit" ;;
  *) echo "unknown client: $NAME" >&2; exit 2 ;;
esac
VENV="$DIR/client-$NAME-venv"
STAMP="$VENV/.tokenpath-client-stamp"

log() { echo "[client_env:$NAME] $*" >&2; }

wanted="python=$PYTHON ${PACKAGES[*]}"
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$wanted" ]]; then
  start=$(date +%s)
  log "installing into $VENV"
  rm -f "$STAMP"
  test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --disable-pip-version-check -q --upgrade pip
  "$VENV/bin/python" -m pip install --disable-pip-version-check -q "${PACKAGES[@]}"
  "$VENV/bin/python" -c "$CHECK" >&2
  echo "$wanted" >"$STAMP"
  log "installed in $(($(date +%s) - start)) s"
fi

echo "$VENV/bin/python"
