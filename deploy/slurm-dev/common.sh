# shellcheck shell=bash
# Shared by up.sh and down.sh (sourced, not run): where the development cluster lives and how
# to find the processes that belong to it.
#
# SLURM_DEV_VERSION  22.05 (default): Debian 12's packages on this host; 24.11: Debian 13's, in
#                    a chroot (see chroot.sh)
# SLURM_DEV_DIR      runtime directory (default <repo>/var/slurm-dev, or var/slurm-dev-24.11):
#                    etc/ state/ spool/ run/ log/ (and ssh/ for 24.11)
# Every daemon up.sh starts carries SLURM_CONF=$D/etc/slurm.conf in its environment, and so does
# every slurmstepd they fork; that is how down.sh tells this cluster's processes from another's.

export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH

# shellcheck source=SCRIPTDIR/../dev/process.sh
source "$(dirname "${BASH_SOURCE[0]}")/../dev/process.sh"

SLURM_DEV_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SLURM_DEV_VERSION=${SLURM_DEV_VERSION:-22.05}
case $SLURM_DEV_VERSION in
  22.05) D=$(realpath -m -- "${SLURM_DEV_DIR:-$SLURM_DEV_REPO/var/slurm-dev}") ;;
  24.11) D=$(realpath -m -- "${SLURM_DEV_DIR:-$SLURM_DEV_REPO/var/slurm-dev-24.11}") ;;
  *)
    say "ERROR: SLURM_DEV_VERSION is 22.05 or 24.11, not '$SLURM_DEV_VERSION'"
    exit 1
    ;;
esac
CONF=$D/etc/slurm.conf
# shellcheck disable=SC2034  # used by up.sh and down.sh
{
  RUN=$D/run
  LOG=$D/log
  NODES=(node001 node002 node003 node004)
}
export SLURM_CONF=$CONF

# shellcheck source-path=SCRIPTDIR source=chroot.sh
source "$(dirname "${BASH_SOURCE[0]}")/chroot.sh"

in_chroot() { [[ $SLURM_DEV_VERSION == 24.11 ]]; }

slurm_cmd() {  # command... -> a Slurm command for this cluster: here, or in the chroot
  if in_chroot; then
    in_root "$@"
  else
    "$@"
  fi
}

comm_of() { cat "/proc/$1/comm" 2>/dev/null || true; }

alive_as() {  # pid, command name -> that pid runs that command
  alive "$1" && [[ $(comm_of "$1") == "$2" ]]
}

ours() {  # pid -> its environment names this cluster's slurm.conf
  grep -qzxF "SLURM_CONF=$CONF" "/proc/$1/environ" 2>/dev/null
}

proc_table() {  # "pid ppid state comm" for every process, read in one pass
  # /proc/PID/stat is "pid (comm) state ppid ...", and comm may itself hold spaces.
  awk '{
    open_paren = index($0, "(")
    close_paren = match($0, /\) [A-Za-z] /)
    comm = substr($0, open_paren + 1, close_paren - open_paren - 1)
    split(substr($0, close_paren + 2), f, " ")
    print $1, f[2], f[1], comm
  }' /proc/[0-9]*/stat 2>/dev/null || true
}

cluster_pids() {  # all|jobs -> pids of this cluster, one a line
  # all: the Slurm daemons and step daemons started for this cluster, and everything below
  # them. jobs: only what runs below its slurmstepd (job scripts and their children).
  local only_jobs=$1 pid ppid state comm changed=1
  local -A parent=() mine=() stepd=() job=()
  while read -r pid ppid state comm; do
    [[ $state == [ZX] ]] && continue
    parent[$pid]=$ppid
    case $comm in
      slurmctld | slurmd) ours "$pid" && mine[$pid]=1 ;;
      slurmstepd) ours "$pid" && mine[$pid]=1 && stepd[$pid]=1 ;;
    esac
  done < <(proc_table)
  while ((changed)); do
    changed=0
    for pid in "${!parent[@]}"; do
      [[ -z ${mine[$pid]:-} && -n ${mine[${parent[$pid]}]:-} ]] || continue
      mine[$pid]=1
      changed=1
      [[ -n ${stepd[${parent[$pid]}]:-} || -n ${job[${parent[$pid]}]:-} ]] && job[$pid]=1
    done
  done
  if [[ $only_jobs == jobs ]]; then
    for pid in "${!job[@]}"; do alive "$pid" && echo "$pid"; done
  else
    for pid in "${!mine[@]}"; do alive "$pid" && echo "$pid"; done
  fi
  return 0
}

slurm_pids_anywhere() {  # live Slurm daemons of any cluster on this machine
  proc_table | awk '$3 !~ /^[ZX]$/ && ($4 == "slurmctld" || $4 == "slurmd" || $4 == "slurmstepd") { print $1 }'
}

stop_pids() {  # pids... -> SIGTERM, wait up to 10 s, then SIGKILL whatever is left
  local pid left=() i
  (($# > 0)) || return 0
  kill -TERM "$@" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    left=()
    for pid in "$@"; do alive "$pid" && left+=("$pid"); done
    ((${#left[@]} == 0)) && return 0
    sleep 0.1
  done
  say "still running after 10 s, sending SIGKILL: ${left[*]}"
  kill -KILL "${left[@]}" 2>/dev/null || true
  local killed=("${left[@]}")
  for ((i = 0; i < 50; i++)); do
    left=()
    for pid in "${killed[@]}"; do alive "$pid" && left+=("$pid"); done
    ((${#left[@]} == 0)) && return 0
    sleep 0.1
  done
  say "could not stop: ${left[*]}"
  return 1
}

stop_cluster_processes() {  # everything of this cluster: jobs, step daemons, slurmd, slurmctld
  local pid i
  local -a jobs=() stepds=() targets=()
  local -A seen=()
  # Jobs first. slurmstepd ignores SIGTERM, but exits by itself once its job is gone (within
  # 0.1 s while slurmctld answers; it keeps retrying when slurmctld is gone).
  mapfile -t jobs < <(cluster_pids jobs)
  if ((${#jobs[@]} > 0)); then
    say "stopping ${#jobs[@]} job processes of the cluster in $D: ${jobs[*]}"
    stop_pids "${jobs[@]}" || true
  fi
  for ((i = 0; i < 20; i++)); do
    stepds=()
    for pid in $(cluster_pids all); do
      [[ $(comm_of "$pid") == slurmstepd ]] && stepds+=("$pid")
    done
    ((${#stepds[@]} > 0)) || break
    sleep 0.1
  done
  if ((${#stepds[@]} > 0)); then
    say "sending SIGKILL to slurmstepd with no job left: ${stepds[*]}"
    kill -KILL "${stepds[@]}" 2>/dev/null || true
  fi
  # Then the daemons named in the pid files, and whatever else carries this cluster's
  # slurm.conf (a daemon whose pid file is gone, a slurmstepd that is still there).
  for file in "$RUN"/slurmd.*.pid "$RUN"/slurmctld.pid; do
    pid=$(pid_in "$file")
    # A stale pid file may name a pid that now runs something else: check what it runs.
    if [[ -n $pid ]] && { alive_as "$pid" slurmd || alive_as "$pid" slurmctld; } \
      && ours "$pid"; then
      seen[$pid]=1
      targets+=("$pid")
    fi
  done
  while read -r pid; do
    [[ -n $pid && -z ${seen[$pid]:-} ]] || continue
    seen[$pid]=1
    targets+=("$pid")
  done < <(cluster_pids all)
  if ((${#targets[@]} > 0)); then
    say "stopping ${#targets[@]} processes of the cluster in $D: ${targets[*]}"
    stop_pids "${targets[@]}" || true
  fi
}
