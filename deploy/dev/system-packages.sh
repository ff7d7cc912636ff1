#!/usr/bin/env bash
# Debian packages the project needs to build and run: the MariaDB client library for
# mysqlclient, a compiler, and redis-server for the demo when no Redis answers.
# Installs only what is missing; says what it cannot provide.
set -euo pipefail

missing=()
pkg-config --exists mysqlclient 2>/dev/null || pkg-config --exists libmariadb 2>/dev/null \
  || missing+=(libmariadb-dev)
command -v pkg-config >/dev/null || missing+=(pkg-config)
command -v gcc >/dev/null || missing+=(build-essential)
command -v redis-server >/dev/null || missing+=(redis-server)

if ((${#missing[@]} == 0)); then
  exit 0
fi

if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
  echo "Missing system packages: ${missing[*]}." >&2
  echo "Install them with your package manager (Debian: apt-get install ${missing[*]})." >&2
  exit 1
fi

echo "Installing system packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
