#!/usr/bin/env bash
# Prometheus for the metrics connector's tests: Debian's `prometheus` at /usr/bin/prometheus,
# started by the tests as a plain subprocess (its own config, port and storage under a tmp dir;
# the packaged service is never used). Installs it only when missing; says what it cannot provide.
set -euo pipefail

command -v prometheus >/dev/null && exit 0

if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
  echo "Prometheus is missing: the metrics connector's tests need /usr/bin/prometheus." >&2
  echo "Install it with your package manager (Debian: apt-get install prometheus)." >&2
  exit 1
fi

echo "Installing Prometheus for the metrics connector's tests"
export DEBIAN_FRONTEND=noninteractive
apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends prometheus >/dev/null 2>&1 \
  || { apt-get update -qq && apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends prometheus >/dev/null; }
