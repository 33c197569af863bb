#!/usr/bin/env bash
# Debian packages the tests need, installed only when missing: a real Prometheus and
# promtool for rules and scraping, Alertmanager for alert delivery, Chromium for the UI,
# and a C compiler (with Python's headers) for the fake NVIDIA driver library the agent's
# NVML tests load and for the collector's compiled OTLP decoder, which the package build
# compiles when it can (make test runs this before it builds the virtual environment).
set -euo pipefail
need=()
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || command -v alertmanager >/dev/null 2>&1 \
  || need+=(prometheus-alertmanager)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1 || need+=(gcc libc6-dev)
python3 -c 'import pathlib, sys, sysconfig
sys.exit(not pathlib.Path(sysconfig.get_paths()["include"], "Python.h").is_file())' \
  || need+=(python3-dev)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-system-deps: missing ${need[*]}; run as root or install them (tests needing them skip)" >&2
  exit 0
fi
echo "install-system-deps: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
