#!/usr/bin/env bash
# The browser for the Console's tests: Debian's Chromium at /usr/bin/chromium, driven by
# Playwright with executable_path (Playwright's own browser download is never used).
# Installs it only when missing; says what it cannot provide.
set -euo pipefail

command -v chromium >/dev/null && exit 0

if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
  echo "Chromium is missing: the Console's browser tests need /usr/bin/chromium." >&2
  echo "Install it with your package manager (Debian: apt-get install chromium)." >&2
  exit 1
fi

echo "Installing Chromium for the Console's browser tests"
export DEBIAN_FRONTEND=noninteractive
apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends chromium >/dev/null 2>&1 \
  || { apt-get update -qq && apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends chromium >/dev/null; }
