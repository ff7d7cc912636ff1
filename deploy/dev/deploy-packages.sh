#!/usr/bin/env bash
# Debian packages for `make deploy-check`: systemd-analyze and systemd-sysusers (package systemd,
# with the units they read in /usr/lib/systemd/system), unshare (util-linux) to run each role
# under the units' restrictions, and shellcheck for the image's entry point (hadolint and kubectl
# come from PyPI with the test dependencies). Installs only what is missing; says what it cannot
# provide.
set -euo pipefail

missing=()
command -v systemd-analyze >/dev/null || missing+=(systemd)
command -v unshare >/dev/null || missing+=(util-linux)
command -v shellcheck >/dev/null || missing+=(shellcheck)

if ((${#missing[@]} == 0)); then
  exit 0
fi

if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
  echo "Missing for the deployment checks: ${missing[*]}." >&2
  echo "Install them with your package manager (Debian: apt-get install ${missing[*]})." >&2
  exit 1
fi

echo "Installing for the deployment checks: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}" \
  >/dev/null 2>&1 \
  || { apt-get update -qq && apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
    --no-install-recommends "${missing[@]}" >/dev/null; }
