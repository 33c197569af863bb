#!/usr/bin/env bash
# Create (or reuse) a virtual environment with the OLDEST OpenTelemetry packages tokenpath
# supports (the lower end of instrumentation/sdk_compat.py's tested range) and this
# checkout installed in it, editable: tests/instrumentation/test_oldest_otel.py runs the
# shims' tests in it, so `make test` runs them on the oldest SDK and (in the project's
# venv) on the newest. Idempotent and cached per checkout (the editable install points at
# one checkout); reinstalled when the pins, the interpreter or pyproject.toml change.
# Prints the venv's python path as its last line.
#
# Environment:
#   TOKENPATH_OTEL_OLDEST_VENV    where the venv lives
#                                 (default ~/.cache/tokenpath/otel-oldest-<checkout hash>)
#   TOKENPATH_OTEL_OLDEST_PYTHON  interpreter that creates the venv (default python3.11)
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
checkout=$(printf '%s' "$REPO" | sha256sum | cut -c1-12)
VENV="${TOKENPATH_OTEL_OLDEST_VENV:-$HOME/.cache/tokenpath/otel-oldest-$checkout}"
PYTHON="${TOKENPATH_OTEL_OLDEST_PYTHON:-python3.11}"
STAMP="$VENV/.tokenpath-otel-oldest-stamp"
# The oldest supported: opentelemetry-api/sdk/exporters/proto 1.30.0 and the contrib
# instrumentations released with them (0.51b0). opentelemetry-proto 1.30 requires
# protobuf >= 5, < 6 (tokenpath itself requires protobuf >= 5).
PINS=(
  "opentelemetry-api==1.30.0"
  "opentelemetry-sdk==1.30.0"
  "opentelemetry-proto==1.30.0"
  "opentelemetry-exporter-otlp-proto-common==1.30.0"
  "opentelemetry-exporter-otlp-proto-http==1.30.0"
  "opentelemetry-exporter-otlp-proto-grpc==1.30.0"
  "opentelemetry-semantic-conventions==0.51b0"
  "opentelemetry-instrumentation==0.51b0"
  "opentelemetry-instrumentation-asgi==0.51b0"
  "opentelemetry-instrumentation-fastapi==0.51b0"
  "opentelemetry-util-http==0.51b0"
  "protobuf>=5,<6"
)

log() { echo "[otel_oldest_env] $*" >&2; }

wanted="python=$PYTHON repo=$REPO pyproject=$(sha256sum "$REPO/pyproject.toml" | cut -c1-16) ${PINS[*]}"
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$wanted" ]]; then
  start=$(date +%s)
  log "installing the oldest supported OpenTelemetry packages into $VENV"
  rm -f "$STAMP"
  # another interpreter: a fresh venv (a venv keeps the one it was made with)
  if [[ -n "$VENV" && -f "$VENV/.tokenpath-python" && "$(cat "$VENV/.tokenpath-python")" != "$PYTHON" ]]; then
    rm -rf "$VENV"
  fi
  test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
  echo "$PYTHON" >"$VENV/.tokenpath-python"
  pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
  "${pip[@]}" install --upgrade pip "setuptools>=68" wheel
  constraints="$VENV/oldest-constraints.txt"
  printf '%s\n' "${PINS[@]}" >"$constraints"
  # tokenpath's own requirements (the dev extra: pytest, hypothesis, ...) resolved under
  # the pins, then tokenpath itself, editable, without its compiled core
  requirements="$VENV/tokenpath-requirements.txt"
  "$VENV/bin/python" - "$REPO/pyproject.toml" >"$requirements" <<'EOF'
import sys
import tomllib

project = tomllib.load(open(sys.argv[1], "rb"))["project"]
for requirement in project["dependencies"] + project["optional-dependencies"]["dev"]:
    # what the shims' tests need: not the browser, manifest or type-check tools
    if not requirement.startswith(("playwright", "kubernetes-validate", "mypy", "types-",
                                   "grpc-stubs", "ruff")):
        print(requirement)
EOF
  "${pip[@]}" install -c "$constraints" "${PINS[@]}" -r "$requirements"
  (cd "$REPO" && TOKENPATH_COMPILE=0 "${pip[@]}" install -c "$constraints" -e . --no-deps)
  "$VENV/bin/python" - <<'EOF' >&2
from importlib.metadata import version

for name in ("opentelemetry-api", "opentelemetry-sdk", "opentelemetry-proto",
             "opentelemetry-exporter-otlp-proto-http", "opentelemetry-exporter-otlp-proto-grpc"):
    assert version(name) == "1.30.0", (name, version(name))
import tokenpath.instrumentation.gateway  # noqa: F401  (the checkout imports)
EOF
  echo "$wanted" >"$STAMP"
  log "installed in $(($(date +%s) - start)) s"
fi

echo "$VENV/bin/python"
