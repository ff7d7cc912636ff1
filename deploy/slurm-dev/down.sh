#!/usr/bin/env bash
# Stop the development cluster that up.sh started in SLURM_DEV_DIR (default var/slurm-dev, or
# var/slurm-dev-24.11 with SLURM_DEV_VERSION=24.11): its slurmd, its slurmctld, the slurmstepd
# and job processes they left behind, and munged when up.sh started it and no other Slurm daemon
# still uses it. SIGTERM first, SIGKILL after 10 s. Only processes whose environment names this
# cluster's slurm.conf are touched. For 24.11 also the chroot's sshd and its sessions, and the
# cluster's mount namespace is let go (the chroot itself is kept). Exits 0 when nothing of the
# cluster is left running; running it again does nothing.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if [[ ! -d $D ]]; then
  exit 0
fi

stop_cluster_processes
if in_chroot; then stop_root_sshd; fi

munged=$(pid_in "$RUN/munged.pid")
if [[ -n $munged ]] && alive_as "$munged" munged; then
  if in_chroot; then
    others=$(root_slurm_pids | tr '\n' ' ')
  else
    others=$(slurm_pids_anywhere | tr '\n' ' ')
  fi
  if [[ -n ${others// /} ]]; then
    # Keep the record: running down.sh again once they are gone stops it.
    say "leaving munged ($munged) running: other Slurm processes use it: $others"
  else
    say "stopping munged ($munged), which up.sh started"
    stop_pids "$munged" && rm -f "$RUN/munged.pid"
  fi
else
  rm -f "$RUN/munged.pid"
fi
rm -f "$RUN"/slurmd.*.pid "$RUN"/slurmctld.pid

if in_chroot; then
  # Whatever else still runs in the cluster's namespace (a munged that others use stays).
  leftovers=()
  for pid in $(ns_pids); do
    [[ $pid == "$(pid_in "$RUN/munged.pid")" ]] || leftovers+=("$pid")
  done
  if ((${#leftovers[@]} > 0)); then
    say "stopping ${#leftovers[@]} processes left in the chroot's namespace: ${leftovers[*]}"
    stop_pids "${leftovers[@]}" || true
  fi
  ns_release
fi

remaining=$(cluster_pids all | tr '\n' ' ')
if [[ -n ${remaining// /} ]]; then
  say "ERROR: still running: $remaining"
  exit 1
fi
