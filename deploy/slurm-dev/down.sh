#!/usr/bin/env bash
# Stop the development cluster that up.sh started in SLURM_DEV_DIR (default var/slurm-dev):
# its slurmd, its slurmctld, the slurmstepd and job processes they left behind, and munged
# when up.sh started it and no other Slurm daemon still uses it. SIGTERM first, SIGKILL after
# 10 s. Only processes whose environment names this cluster's slurm.conf are touched. Exits 0
# when nothing of the cluster is left running; running it again does nothing.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if [[ ! -d $D ]]; then
  exit 0
fi

stop_cluster_processes

munged=$(pid_in "$RUN/munged.pid")
if [[ -n $munged ]] && alive_as "$munged" munged; then
  others=$(slurm_pids_anywhere | tr '\n' ' ')
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

remaining=$(cluster_pids all | tr '\n' ' ')
if [[ -n ${remaining// /} ]]; then
  say "ERROR: still running: $remaining"
  exit 1
fi
