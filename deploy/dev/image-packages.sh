#!/usr/bin/env bash
# Debian packages to build the control plane's image:
#   image-packages.sh build   buildah, and debootstrap for a base made without a registry
#                             (deploy/image/build.sh)
# The image's lint (hadolint from PyPI, shellcheck) is deploy/dev/deploy-packages.sh's.
# Installs only what is missing; says what it cannot provide.
set -euo pipefail

missing=()
case ${1:-} in
  build)
    command -v buildah >/dev/null || missing+=(buildah)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    ;;
  *)
    echo "usage: $0 build" >&2
    exit 2
    ;;
esac

if ((${#missing[@]} == 0)); then
  exit 0
fi

if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
  echo "Missing for the image ($1): ${missing[*]}." >&2
  echo "Install them with your package manager (Debian: apt-get install ${missing[*]})." >&2
  exit 1
fi

echo "Installing for the image ($1): ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}" \
  >/dev/null 2>&1 \
  || { apt-get update -qq && apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
    --no-install-recommends "${missing[@]}" >/dev/null; }
