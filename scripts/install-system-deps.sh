#!/usr/bin/env bash
# Debian packages the tests need, installed only when missing: a real Prometheus and
# promtool for rules and scraping, Alertmanager for alert delivery, Chromium for the UI.
set -euo pipefail
need=()
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || command -v alertmanager >/dev/null 2>&1 \
  || need+=(prometheus-alertmanager)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
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
