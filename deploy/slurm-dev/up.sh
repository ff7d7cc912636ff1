#!/usr/bin/env bash
# Start a four-node Slurm cluster on this machine (root, no systemd needed): munged when none is
# running, one slurmctld, and one slurmd per node (node001..node004). Partitions: debug (all
# four nodes, the default) and canary (node001-node002). Does nothing when the cluster in
# SLURM_DEV_DIR is already up.
#
# Slurm 22.05 (the default) runs from Debian 12's packages on this host, installed when the
# binaries are missing. Slurm 24.11 (SLURM_DEV_VERSION=24.11) runs from Debian 13's packages in a
# chroot that is built once (see chroot.sh), with an sshd in it that is the way in.
#
# Prints the lines to run in a shell afterwards:  eval "$(deploy/slurm-dev/up.sh)"
#   SLURM_CONF; for 24.11 also SLURM_DEV_ROOT, SLURM_DEV_SSH_PORT, SLURM_DEV_SSH_KEY and
#   SLURM_DEV_SSH_KNOWN_HOSTS (24.11's commands run in the chroot, or over that SSH)
#
# SLURM_DEV_VERSION    22.05 (default) or 24.11
# SLURM_DEV_DIR        runtime directory (default var/slurm-dev, or var/slurm-dev-24.11)
# SLURM_DEV_CTLD_PORT  slurmctld port (default 6817; 17010 for 24.11)
# SLURM_DEV_NODE_PORT  port of node001; node002..node004 take the next three (default 17001;
#                      17011 for 24.11)
# SLURM_DEV_SSH_PORT   24.11 only: the chroot's sshd on 127.0.0.1 (default 2310)
# SLURM_DEV_ROOT       24.11 only: the chroot (default var/slurm-trixie-root)
# SLURM_DEV_TIMEOUT    seconds to wait for four idle nodes (default 60)
# SLURM_DEV_ID_SLOT    0-3: which quarter of the job id space the cluster hands ids out of
#                      (default 0; 2 for 24.11); clusters side by side take different slots
# Two clusters can run side by side when their directories and ports differ; munged is shared
# (the host's by 22.05 clusters, the chroot's by 24.11 clusters).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if in_chroot; then
  ctld_port=${SLURM_DEV_CTLD_PORT:-17010}
  first_node_port=${SLURM_DEV_NODE_PORT:-17011}
  ssh_port=${SLURM_DEV_SSH_PORT:-2310}
else
  ctld_port=${SLURM_DEV_CTLD_PORT:-6817}
  first_node_port=${SLURM_DEV_NODE_PORT:-17001}
fi
timeout=${SLURM_DEV_TIMEOUT:-60}
started_at=$(date +%s.%N)
cold=0

elapsed() { awk -v a="$started_at" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }

tail_of() {  # files... -> their last lines, indented, for an error message
  local f
  for f in "$@"; do
    [[ -s $f ]] || continue
    echo "  --- tail of $f" >&2
    tail -n 15 "$f" | sed 's/^/    /' >&2
  done
}

fail() {  # message, log files to show...
  local message=$1
  shift
  say "ERROR: $message"
  tail_of "$@"
  if ((cold)); then
    say "stopping what this start left running"
    SLURM_DEV_DIR=$D SLURM_DEV_VERSION=$SLURM_DEV_VERSION \
      "$(dirname "${BASH_SOURCE[0]}")/down.sh" >&2 || true
  fi
  exit 1
}

install_packages() {
  if in_chroot; then
    build_root
    return 0
  fi
  local missing=() cmd
  for cmd in slurmctld slurmd sbatch scontrol sinfo munged munge unmunge; do
    command -v "$cmd" >/dev/null || missing+=("$cmd")
  done
  ((${#missing[@]} == 0)) && return 0
  if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
    say "ERROR: missing ${missing[*]}; install as root: apt-get install slurmctld slurmd slurm-client munge"
    exit 1
  fi
  local packages=(slurmctld slurmd slurm-client munge) apt_log=$LOG/apt.log
  say "installing ${packages[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq --no-install-recommends "${packages[@]}" >"$apt_log" 2>&1; then
    say "apt-get install failed; running apt-get update first"
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${packages[@]}"; } \
      >>"$apt_log" 2>&1 || fail "could not install ${packages[*]}" "$apt_log"
  fi
}

node_port() {  # node name -> its slurmd port
  echo $((first_node_port + 10#${1#node} - 1))
}

node_states() {  # "node001 idle" lines, one per node (sinfo lists a node once per partition)
  slurm_cmd timeout 5 sinfo -h -N -o '%N %t' 2>/dev/null | sort -u
}

count_nodes_in() {  # states... -> how many of the four nodes are in one of them
  local states=" $* "
  node_states | awk -v states="$states" 'index(states, " " $2 " ") { n++ } END { print n + 0 }'
}

ctld_pid() {
  local pid
  pid=$(pid_in "$RUN/slurmctld.pid")
  alive_as "$pid" slurmctld && ours "$pid" && echo "$pid"
  return 0
}

slurmd_pid() {  # node -> the pid of its slurmd, when running
  local pid
  pid=$(pid_in "$RUN/slurmd.$1.pid")
  alive_as "$pid" slurmd && ours "$pid" && echo "$pid"
  return 0
}

ctld_answers() { slurm_cmd timeout 5 scontrol ping 2>/dev/null | grep -q ' is UP'; }

all_slurmd_running() {
  local node
  for node in "${NODES[@]}"; do [[ -n $(slurmd_pid "$node") ]] || return 1; done
}

cluster_up() {
  [[ -f $CONF && -n $(ctld_pid) ]] && all_slurmd_running && ctld_answers \
    && (($(count_nodes_in idle mix alloc comp) == ${#NODES[@]})) \
    && { ! in_chroot || { [[ -n $(ssh_listener_pid) ]] && ssh_answers; }; }
}

print_settings() {
  echo "export SLURM_CONF=$CONF"
  if in_chroot; then print_ssh_settings; fi
}

port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

munge_answers() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munged() {
  local pid
  if in_chroot; then
    start_root_munged
    return 0
  fi
  if munge_answers; then
    # Keep the record only while the munged it names is the one up.sh started earlier.
    pid=$(pid_in "$RUN/munged.pid")
    [[ -n $pid ]] && ! alive_as "$pid" munged && rm -f "$RUN/munged.pid"
    return 0
  fi
  rm -f "$RUN/munged.pid"
  if [[ ! -s /etc/munge/munge.key ]]; then
    say "creating /etc/munge/munge.key"
    runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key
  fi
  install -d -o munge -g munge -m 0755 /run/munge
  rm -f /run/munge/munged.pid
  say "starting munged"
  runuser -u munge -- /usr/sbin/munged --force </dev/null >>"$LOG/munged.out" 2>&1 \
    || fail "munged did not start" "$LOG/munged.out" /var/log/munge/munged.log
  for ((i = 0; i < 100; i++)); do
    pid=$(pid_in /run/munge/munged.pid)
    if alive_as "$pid" munged && munge_answers; then
      echo "$pid" >"$RUN/munged.pid"
      return 0
    fi
    sleep 0.1
  done
  fail "munged did not answer within 10 s" "$LOG/munged.out" /var/log/munge/munged.log
}

wait_for_fresh_pid() {  # pid file, command, node or "" -> waits until the file names a live one
  local file=$1 cmd=$2 node=$3 pid i
  for ((i = 0; i < 500; i++)); do
    pid=$(pid_in "$file")
    # The file can still name an earlier process or the one that forked the daemon: insist on
    # the daemon itself, for this cluster and node, seen alive twice.
    if alive_as "$pid" "$cmd" && ours "$pid" \
      && { [[ -z $node ]] || tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qw -- "$node"; }; then
      sleep 0.02
      [[ $(pid_in "$file") == "$pid" ]] && alive_as "$pid" "$cmd" && return 0
    fi
    sleep 0.02
  done
  return 1
}

start_slurmctld() {
  say "starting slurmctld"
  rm -f "$RUN/slurmctld.pid"
  slurm_cmd slurmctld </dev/null >>"$LOG/slurmctld.out" 2>&1 \
    || fail "slurmctld did not start" "$LOG/slurmctld.out" "$LOG/slurmctld.log"
  wait_for_fresh_pid "$RUN/slurmctld.pid" slurmctld "" \
    || fail "slurmctld wrote no pid file within 10 s" "$LOG/slurmctld.out" "$LOG/slurmctld.log"
  local i
  for ((i = 0; i < 200; i++)); do
    ctld_answers && return 0
    sleep 0.05
  done
  fail "slurmctld did not answer scontrol ping within 10 s" "$LOG/slurmctld.out" \
    "$LOG/slurmctld.log"
}

start_slurmd() {  # node
  local node=$1
  say "starting slurmd for $node on port $(node_port "$node")"
  mkdir -p "$D/spool/$node"
  rm -f "$RUN/slurmd.$node.pid"
  slurm_cmd slurmd -N "$node" </dev/null >>"$LOG/slurmd.$node.out" 2>&1 \
    || fail "slurmd for $node did not start" "$LOG/slurmd.$node.out" "$LOG/slurmd.$node.log"
  wait_for_fresh_pid "$RUN/slurmd.$node.pid" slurmd "$node" \
    || fail "slurmd for $node wrote no pid file within 10 s" "$LOG/slurmd.$node.out" \
      "$LOG/slurmd.$node.log"
}

wait_for_nodes() {  # states a node may be in to count as up...
  local deadline node state logs=()
  deadline=$(($(date +%s) + timeout))
  while (($(date +%s) < deadline)); do
    (($(count_nodes_in "$@") == ${#NODES[@]})) && return 0
    sleep 0.05
  done
  local not_up=()
  for node in "${NODES[@]}"; do
    state=$(node_states | awk -v n="$node" '$1 == n { print $2 }')
    case " $* " in *" $state "*) continue ;; esac
    not_up+=("$node (${state:-not listed})")
    logs+=("$LOG/slurmd.$node.log")
  done
  fail "after ${timeout}s these nodes are not $*: ${not_up[*]}" "${logs[@]}" "$LOG/slurmctld.log"
}

write_conf() {
  local template conf node
  template=$(<"$(dirname "${BASH_SOURCE[0]}")/slurm.conf.in")
  # Fresh starts wipe the saved state, so the job id counter would restart at 1 and collide
  # with checkpoints and logs keyed by job id. Start from the clock instead: 60 ids per second
  # since a point that repeats every 2.9 days, in the cluster's slot of 15,000,000 ids, so that
  # clusters running side by side (as the tests run them) never hand out the same id: a job's
  # processes, and its rendezvous port, are found by it. The last slot stays under Slurm's
  # MaxJobId (67043328).
  local slot=${SLURM_DEV_ID_SLOT:-}
  if [[ -z $slot ]]; then if in_chroot; then slot=2; else slot=0; fi; fi
  [[ $slot =~ ^[0-3]$ ]] || fail "SLURM_DEV_ID_SLOT is 0, 1, 2 or 3, not '$slot'"
  local first_job_id=$((slot * 15000000 + ($(date +%s) % 250000) * 60 + 1))
  conf=${template//@DIR@/"$D"}
  conf=${conf//@CTLD_PORT@/"$ctld_port"}
  conf=${conf//@FIRST_JOB_ID@/"$first_job_id"}
  for node in "${NODES[@]}"; do
    conf=${conf//"@${node^^}_PORT@"/"$(node_port "$node")"}
  done
  if [[ $conf == *@[A-Z0-9_]*@* ]]; then
    fail "slurm.conf.in has a field up.sh does not fill: $(grep -o '@[A-Z0-9_]*@' <<<"$conf" | head -1)"
  fi
  printf '%s\n' "$conf" >"$CONF"
  # Slurm reads cgroup.conf next to slurm.conf. 24.11's slurmd will not start without cgroups
  # mounted unless the plugin is off (22.05 does not need the file).
  if in_chroot; then
    echo "CgroupPlugin=disabled" >"$D/etc/cgroup.conf"
  fi
}

mkdir -p "$D/etc" "$D/run" "$LOG"
install_packages
if in_chroot; then
  if [[ ! $ssh_port =~ ^[0-9]+$ ]] || ((ssh_port < 1 || ssh_port > 65535)); then
    fail "SLURM_DEV_SSH_PORT must be a port number, not '$ssh_port'"
  fi
  [[ $D == *[[:space:]\"\\]* ]] && fail "SLURM_DEV_DIR may not hold spaces, quotes or backslashes: $D"
  ns_setup
fi

if cluster_up; then
  say "the cluster in $D is already up"
  print_settings
  exit 0
fi

if [[ -f $CONF && -n $(ctld_pid) ]] && ctld_answers; then
  # slurmctld is fine: start only the slurmd that are missing, keeping jobs and state.
  start_munged
  for node in "${NODES[@]}"; do
    [[ -n $(slurmd_pid "$node") ]] || start_slurmd "$node"
  done
  wait_for_nodes idle mix alloc comp
  if in_chroot; then start_root_sshd; fi
  say "cluster in $D repaired in $(elapsed) s"
  print_settings
  exit 0
fi

if [[ -n $(cluster_pids all) ]]; then
  say "stopping what an earlier start left running"
  stop_cluster_processes
fi
ports=("$ctld_port")
if in_chroot && [[ -z $(ssh_listener_pid) ]]; then ports+=("$ssh_port"); fi
for node in "${NODES[@]}"; do ports+=("$(node_port "$node")"); done
for port in "${ports[@]}"; do
  if port_taken "$port"; then
    fail "port $port on 127.0.0.1 is taken (another cluster? stop it with its down.sh, or set SLURM_DEV_CTLD_PORT and SLURM_DEV_NODE_PORT)"
  fi
done

# From here on a failure stops everything this start began.
cold=1
start_munged
rm -rf "$D/state" "$D/spool"
mkdir -p "$D/state"
for node in "${NODES[@]}"; do mkdir -p "$D/spool/$node"; done
rm -f "$RUN"/slurmctld.pid "$RUN"/slurmd.*.pid
for f in "$LOG"/slurmctld.log "$LOG"/slurmctld.out "$LOG"/slurmd.*.log "$LOG"/slurmd.*.out; do
  [[ -e $f ]] && : >"$f"
done
write_conf

start_slurmctld
for node in "${NODES[@]}"; do start_slurmd "$node"; done
wait_for_nodes idle
if in_chroot; then start_root_sshd; fi

say "cluster in $D up in $(elapsed) s: $(slurm_cmd sinfo -h -o '%P %D %t' | tr '\n' ' ')"
print_settings
