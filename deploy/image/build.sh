#!/usr/bin/env bash
# Builds the control plane's image (deploy/image/Containerfile) with buildah, as root, with the
# repository root as the build context:
#
#   deploy/image/build.sh [more `buildah build` arguments]
#
# The base is WR_IMAGE_BASE when it is set: an image a registry serves, such as
# docker.io/library/debian:bookworm-slim. Otherwise no registry is needed: the base is a Debian 12
# root file system made with debootstrap (kept in var/image/, made again only when missing or
# from another mirror), brought up to date with bookworm's security updates and committed as
# localhost/debian-bookworm-base (made again with WR_IMAGE_REFRESH_BASE=1).
#
# Environment:
#   WR_IMAGE             the image's name (default localhost/workload-recovery:dev)
#   WR_IMAGE_BASE        a base image to use instead of the debootstrapped one
#   WR_IMAGE_MIRROR      the Debian mirror (default http://deb.debian.org/debian)
#   WR_IMAGE_SECURITY_MIRROR   its security updates (default http://deb.debian.org/debian-security)
#   WR_IMAGE_CA_BUNDLE   the CA bundle pip trusts during the build, as a build secret that no
#                        layer keeps (default: this host's, /etc/ssl/certs/ca-certificates.crt,
#                        which holds a proxy's CA where HTTPS is intercepted); empty: pip's own
#   BUILDAH_ISOLATION    buildah's; default chroot here, which needs no OCI runtime (runc, crun)
#   STORAGE_DRIVER       buildah's (default: its storage.conf, overlay on Debian)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
IMAGE=${WR_IMAGE:-localhost/workload-recovery:dev}
MIRROR=${WR_IMAGE_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${WR_IMAGE_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
CA_BUNDLE=${WR_IMAGE_CA_BUNDLE-/etc/ssl/certs/ca-certificates.crt}
ISOLATION=${BUILDAH_ISOLATION:-chroot}
LOCAL_BASE=localhost/debian-bookworm-base
WORK=$REPO/var/image
ROOTFS=$WORK/debian-bookworm-rootfs
# Written last into a finished root file system: what it was made from.
ROOTFS_STAMP="debootstrap --variant=minbase bookworm $MIRROR"
STAMP_LABEL=io.workload-recovery.base-source

say() { echo "image: $*" >&2; }
fail() {
  say "ERROR: $1"
  [[ -n ${2:-} && -f $2 ]] && tail -n 30 "$2" >&2
  exit 1
}

rootfs_ready() {
  [[ -f $ROOTFS/.stamp && $(<"$ROOTFS/.stamp") == "$ROOTFS_STAMP" && -x $ROOTFS/usr/bin/apt-get ]]
}

make_rootfs() {
  rootfs_ready && return 0
  local partial=$ROOTFS.partial log=$WORK/debootstrap.log began
  began=$(date +%s)
  say "making a Debian 12 root file system in $ROOTFS (debootstrap, about a minute)"
  rm -rf --one-file-system -- "$partial" "$ROOTFS"
  debootstrap --variant=minbase bookworm "$partial" "$MIRROR" >"$log" 2>&1 \
    || fail "debootstrap failed (log: $log)" "$log"
  # The sources an official Debian image has: the release, its updates and security updates.
  rm -f "$partial/etc/apt/sources.list"
  cat >"$partial/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY_MIRROR
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  rm -rf "$partial"/var/cache/apt/archives/*.deb "$partial"/var/lib/apt/lists/*
  printf '%s\n' "$ROOTFS_STAMP" >"$partial/.stamp"
  mv "$partial" "$ROOTFS"
  say "made $ROOTFS in $(($(date +%s) - began)) s"
}

base_current() {
  [[ ${WR_IMAGE_REFRESH_BASE:-} != 1 ]] || return 1
  local source
  source=$(buildah inspect --type image --format "{{index .OCIv1.Config.Labels \"$STAMP_LABEL\"}}" \
    "$LOCAL_BASE" 2>/dev/null) || return 1
  [[ $source == "$ROOTFS_STAMP" ]]
}

make_local_base() {
  base_current && return 0
  make_rootfs
  local container mount log=$WORK/base.log began
  began=$(date +%s)
  say "committing $ROOTFS as $LOCAL_BASE, with bookworm's updates"
  container=$(buildah from scratch)
  # Removed whatever happens below; `buildah rm` of a removed container fails harmlessly.
  trap 'buildah rm "$container" >/dev/null 2>&1 || true' EXIT
  mount=$(buildah mount "$container")
  # tar keeps owners, modes and links as debootstrap made them (a copy into the image would not).
  tar -C "$ROOTFS" --exclude=./.stamp -cf - . | tar -C "$mount" --numeric-owner -xpf -
  buildah umount "$container" >/dev/null
  buildah run --isolation "$ISOLATION" "$container" -- sh -c \
    'apt-get update && DEBIAN_FRONTEND=noninteractive apt-get -y upgrade && apt-get clean &&
     rm -rf /var/lib/apt/lists/*' >"$log" 2>&1 \
    || fail "could not update the base (log: $log)" "$log"
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd bash --label "$STAMP_LABEL=$ROOTFS_STAMP" "$container"
  buildah commit --quiet --rm "$container" "$LOCAL_BASE" >/dev/null
  trap - EXIT
  say "committed $LOCAL_BASE in $(($(date +%s) - began)) s"
}

if [[ $(id -u) -ne 0 ]]; then
  fail "building the image needs root (buildah with $ISOLATION isolation, debootstrap)"
fi
"$REPO/deploy/dev/image-packages.sh" build
mkdir -p "$WORK"

base=${WR_IMAGE_BASE:-}
if [[ -z $base ]]; then
  make_local_base
  base=$LOCAL_BASE
fi

secret=()
if [[ -n $CA_BUNDLE ]]; then
  [[ -s $CA_BUNDLE ]] || fail "WR_IMAGE_CA_BUNDLE=$CA_BUNDLE is not a file"
  secret=(--secret "id=ca-bundle,src=$CA_BUNDLE")
fi

began=$(date +%s)
say "building $IMAGE on $base"
buildah build --isolation "$ISOLATION" --layers --pull=missing \
  --file "$REPO/deploy/image/Containerfile" --build-arg "BASE_IMAGE=$base" "${secret[@]}" \
  --tag "$IMAGE" "$@" "$REPO"
say "built $IMAGE in $(($(date +%s) - began)) s"
