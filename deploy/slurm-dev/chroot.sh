# shellcheck shell=bash disable=SC2153,SC2154
# (D, CONF, RUN and LOG come from common.sh, ssh_port and fail from up.sh.)
# Slurm 24.11 beside the host's 22.05: Debian 13 (trixie) in a chroot, for up.sh and down.sh
# (sourced through common.sh, not run). Used when SLURM_DEV_VERSION=24.11.
#
# The root file system is built once with debootstrap in SLURM_DEV_ROOT (default
# var/slurm-trixie-root) and kept; it is built again only when it is missing or incomplete.
# Every cluster started in it gets a mount namespace of its own, held by the file $D/run/mnt.ns,
# in which the chroot has proc, sys and dev, the host's /etc/hosts, and, at the same paths as on
# the host, the repository, /tmp and the Python installation the virtualenv uses (so jobs run
# the host's Python, the venv and torch). None of these mounts is visible outside that
# namespace: removing var/ can never reach the host's /tmp or the repository through them.
#
# In the chroot run their own munged (socket in the chroot's /run/munge, shared by every
# cluster of this root), slurmctld, one slurmd per node, and an sshd on 127.0.0.1 with its own
# host key, client key and known_hosts in $D/ssh, which gives every session SLURM_CONF.

SLURM_DEV_ROOT_DEFAULT=$SLURM_DEV_REPO/var/slurm-trixie-root
# shellcheck disable=SC2034  # used by up.sh and down.sh
{
  ROOT=$(realpath -m -- "${SLURM_DEV_ROOT:-$SLURM_DEV_ROOT_DEFAULT}")
  NS=$D/run/mnt.ns
  SSH_DIR=$D/ssh
  SSH_CONFIG=$D/ssh/sshd_config
  SSH_PIDFILE=$D/ssh/sshd.pid
  SSH_HOST_KEY=$D/ssh/ssh_host_ed25519_key
  SSH_CLIENT_KEY=$D/ssh/client_ed25519
  SSH_KNOWN_HOSTS=$D/ssh/known_hosts
  SSH_LOG=$D/ssh/sshd.log
}
ROOT_SUITE=trixie
ROOT_MIRROR=${SLURM_DEV_MIRROR:-http://deb.debian.org/debian}
# What jobs, hooks and tests need in the chroot. Python is not among them: the host's is
# mounted in.
ROOT_PACKAGES=slurmctld,slurmd,slurm-client,munge,openssh-server,curl,ca-certificates,procps
# Written last by the build: a root without it (or with another package list) is incomplete.
ROOT_READY=$ROOT/etc/slurm-dev-root

# ------------------------------------------------------------------ the root file system

mounts_under() {  # directory -> mount points at or below it, in this mount namespace
  awk -v dir="$1" '$5 == dir || index($5, dir "/") == 1 { print $5 }' /proc/self/mountinfo
}

root_users() {  # directory -> pids of processes whose root directory is it
  local proc
  for proc in /proc/[0-9]*; do
    [[ $(readlink "$proc/root" 2>/dev/null) == "$1" ]] && echo "${proc#/proc/}"
  done
  return 0
}

remove_root() {  # directory -> removed, unless anything is mounted in it or runs in it
  local dir=$1 mounted users
  [[ -e $dir ]] || return 0
  mounted=$(mounts_under "$dir" | tr '\n' ' ')
  if [[ -n ${mounted// /} ]]; then
    fail "will not remove $dir: mounted below it: $mounted(stop its clusters with down.sh)"
  fi
  users=$(root_users "$dir" | tr '\n' ' ')
  if [[ -n ${users// /} ]]; then
    fail "will not remove $dir: processes run in it: $users(stop its clusters with down.sh)"
  fi
  rm -rf --one-file-system -- "$dir"
}

root_ready() {
  [[ -f $ROOT_READY && $(<"$ROOT_READY") == "$ROOT_PACKAGES" && -x $ROOT/usr/sbin/slurmctld ]]
}

build_root() {  # debootstrap the chroot when it is missing or incomplete
  root_ready && return 0
  if [[ $(id -u) -ne 0 ]]; then
    say "ERROR: building $ROOT needs root"
    exit 1
  fi
  local build_log=$LOG/debootstrap.log partial=$ROOT.partial began
  began=$(date +%s)
  if ! command -v debootstrap >/dev/null; then
    command -v apt-get >/dev/null || fail "debootstrap is missing; install it"
    say "installing debootstrap"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get install -y -qq --no-install-recommends debootstrap \
      || { apt-get update -qq && apt-get install -y -qq --no-install-recommends debootstrap; }; } \
      >"$LOG/apt.log" 2>&1 || fail "could not install debootstrap" "$LOG/apt.log"
  fi
  say "building the Slurm 24.11 root in $ROOT (debootstrap $ROOT_SUITE, about a minute)"
  remove_root "$partial"
  remove_root "$ROOT"
  debootstrap --variant=minbase --include="$ROOT_PACKAGES" "$ROOT_SUITE" "$partial" \
    "$ROOT_MIRROR" >"$build_log" 2>&1 \
    || fail "debootstrap $ROOT_SUITE failed (log: $build_log)" "$build_log" \
      "$partial/debootstrap/debootstrap.log"
  [[ -x $partial/usr/sbin/slurmctld && -x $partial/usr/sbin/sshd ]] \
    || fail "debootstrap left no slurmctld or sshd in $partial" "$build_log"
  # munge's postinst made the key; munged insists on its owner and mode.
  chroot "$partial" sh -c 'chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key' \
    || fail "could not set up the munge key in $partial"
  printf '%s\n' "$ROOT_PACKAGES" >"$partial/${ROOT_READY#"$ROOT"/}"
  mv "$partial" "$ROOT"
  say "built $ROOT in $(($(date +%s) - began)) s ($(du -sh "$ROOT" | cut -f1))"
}

# ------------------------------------------------------------------ the mount namespace

python_home() {  # the installation the repository's virtualenv runs, when outside /usr
  local python=$SLURM_DEV_REPO/.venv/bin/python home
  [[ -x $python ]] || return 0
  home=$("$python" -c 'import sys; print(sys.base_prefix)' 2>/dev/null) || return 0
  case $home in
    /usr | /usr/* | / | "") return 0 ;;
  esac
  echo "$home"
}

ns_id() {  # pid or "" (the namespace file) -> the mount namespace's inode
  if [[ -n ${1:-} ]]; then
    readlink "/proc/$1/ns/mnt" 2>/dev/null | tr -dc 0-9
  else
    stat -L -c %i "$NS" 2>/dev/null
  fi
}

ns_held() { [[ -n $(mounts_under "$NS") ]]; }

ns_ready() {  # the namespace is held and the chroot has its mounts there
  ns_held && nsenter --mount="$NS" mountpoint -q "$ROOT/proc" 2>/dev/null \
    && nsenter --mount="$NS" mountpoint -q "$ROOT$SLURM_DEV_REPO" 2>/dev/null
}

ns_pids() {  # pids of every process in this cluster's mount namespace
  local id proc
  id=$(ns_id "")
  [[ -n $id ]] || return 0
  for proc in /proc/[0-9]*; do
    [[ $(ns_id "${proc#/proc/}") == "$id" ]] && alive "${proc#/proc/}" && echo "${proc#/proc/}"
  done
  return 0
}

ns_release() {  # forget the namespace; it goes when its last process does
  if ns_held; then
    umount "$NS" 2>/dev/null || umount -l "$NS"
  fi
  rm -f "$NS"
}

ns_setup() {
  ns_ready && return 0
  ns_release
  local python home_mount=() dir
  python=$(python_home)
  [[ -n $python ]] && home_mount=("$python")
  : >"$NS"
  unshare --mount="$NS" --propagation private true || fail "could not create a mount namespace"
  cp /etc/hosts "$ROOT/etc/hosts"
  for dir in "$SLURM_DEV_REPO" /tmp "${home_mount[@]}"; do
    mkdir -p "$ROOT$dir"
  done
  # shellcheck disable=SC2016  # expanded by the inner bash
  if ! nsenter --mount="$NS" bash -euc '
    root=$1
    shift
    mount -t proc proc "$root/proc"
    mount --bind /sys "$root/sys"
    mount --rbind /dev "$root/dev"
    for dir in "$@"; do mount --bind "$dir" "$root$dir"; done
  ' _ "$ROOT" "$SLURM_DEV_REPO" /tmp "${home_mount[@]}" >"$LOG/mounts.log" 2>&1; then
    ns_release
    fail "could not mount the chroot's file systems" "$LOG/mounts.log"
  fi
}

in_root() {  # command... -> run in the chroot, with this cluster's SLURM_CONF
  nsenter --mount="$NS" chroot "$ROOT" /usr/bin/env SLURM_CONF="$CONF" \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"
}

# ------------------------------------------------------------------ munged in the chroot

root_munge_answers() { in_root sh -c 'munge -n </dev/null | unmunge' >/dev/null 2>&1; }

start_root_munged() {
  local pid i pidfile=$ROOT/run/munge/munged.pid
  if root_munge_answers; then
    pid=$(pid_in "$RUN/munged.pid")
    [[ -n $pid ]] && ! alive_as "$pid" munged && rm -f "$RUN/munged.pid"
    return 0
  fi
  rm -f "$RUN/munged.pid" "$pidfile"
  say "starting munged in $ROOT"
  in_root sh -c 'install -d -o munge -g munge -m 0755 /run/munge &&
    runuser -u munge -- /usr/sbin/munged --force' </dev/null >>"$LOG/munged.out" 2>&1 \
    || fail "munged did not start in $ROOT" "$LOG/munged.out" "$ROOT/var/log/munge/munged.log"
  for ((i = 0; i < 100; i++)); do
    pid=$(pid_in "$pidfile")
    if alive_as "$pid" munged && root_munge_answers; then
      echo "$pid" >"$RUN/munged.pid"
      return 0
    fi
    sleep 0.1
  done
  fail "munged in $ROOT did not answer within 10 s" "$LOG/munged.out" \
    "$ROOT/var/log/munge/munged.log"
}

root_slurm_pids() {  # live Slurm daemons of any cluster in this root
  local pid
  for pid in $(slurm_pids_anywhere); do
    [[ $(readlink "/proc/$pid/root" 2>/dev/null) == "$ROOT" ]] && echo "$pid"
  done
  return 0
}

# ------------------------------------------------------------------ sshd in the chroot

ssh_listener_pid() {
  local pid
  pid=$(pid_in "$SSH_PIDFILE")
  if [[ -n $pid ]] && alive_as "$pid" sshd && [[ $(ns_id "$pid") == "$(ns_id "")" ]]; then
    echo "$pid"
  fi
  return 0
}

ssh_answers() {  # an SSH server answers on 127.0.0.1:$ssh_port (it sends its banner first)
  local banner=""
  # shellcheck disable=SC2016  # $1 is expanded by the inner bash
  banner=$(timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" && head -c 4 <&3' _ "$ssh_port" \
    2>/dev/null) || true
  [[ $banner == SSH- ]]
}

ssh_key() {  # private key file, comment -> generated when missing; its .pub always present
  local key=$1
  if [[ ! -s $key ]]; then
    rm -f "$key" "$key.pub"
    ssh-keygen -q -t ed25519 -N '' -C "$2" -f "$key" </dev/null || fail "ssh-keygen failed"
  elif [[ ! -s $key.pub ]]; then
    ssh-keygen -y -f "$key" >"$key.pub"
  fi
  chmod 600 "$key"
}

write_ssh_config() {  # keys, authorized_keys, known_hosts and sshd_config for $ssh_port
  local conf host_name key_type key_data
  mkdir -p "$SSH_DIR"
  chmod 700 "$SSH_DIR"
  ssh_key "$SSH_HOST_KEY" "slurm-dev 24.11 host key"
  ssh_key "$SSH_CLIENT_KEY" "slurm-dev 24.11 client key"
  cp "$SSH_CLIENT_KEY.pub" "$SSH_DIR/authorized_keys"
  host_name="[127.0.0.1]:$ssh_port"
  read -r key_type key_data _ <"$SSH_HOST_KEY.pub"
  echo "$host_name $key_type $key_data" >"$SSH_KNOWN_HOSTS"
  conf=$(<"$SLURM_DEV_REPO/deploy/ssh-dev/sshd_config.in")
  conf=${conf//@DIR@/"$SSH_DIR"}
  conf=${conf//@PORT@/"$ssh_port"}
  conf=${conf//@USER@/root}
  conf=${conf//@SETENV@/"SetEnv \"SLURM_CONF=$CONF\""}
  printf '%s\n' "$conf" >"$SSH_CONFIG"
}

start_root_sshd() {
  local pid i
  [[ -n $(ssh_listener_pid) ]] && ssh_answers && return 0
  write_ssh_config
  pid=$(ssh_listener_pid)
  [[ -n $pid ]] && stop_pids "$pid"
  port_taken "$ssh_port" \
    && fail "port $ssh_port on 127.0.0.1 is taken (another sshd? set SLURM_DEV_SSH_PORT)"
  say "starting sshd in $ROOT on 127.0.0.1:$ssh_port"
  rm -f "$SSH_PIDFILE"
  : >"$SSH_LOG"
  in_root sh -c 'mkdir -p /run/sshd && chmod 755 /run/sshd' \
    || fail "could not create /run/sshd in $ROOT"
  in_root /usr/sbin/sshd -t -f "$SSH_CONFIG" >"$SSH_DIR/config-check.log" 2>&1 \
    || fail "sshd refuses $SSH_CONFIG" "$SSH_DIR/config-check.log"
  in_root /usr/sbin/sshd -f "$SSH_CONFIG" -E "$SSH_LOG" </dev/null \
    || fail "sshd did not start" "$SSH_LOG"
  for ((i = 0; i < 100; i++)); do
    [[ -n $(ssh_listener_pid) ]] && ssh_answers && return 0
    sleep 0.1
  done
  fail "sshd did not answer on 127.0.0.1:$ssh_port within 10 s" "$SSH_LOG"
}

stop_root_sshd() {  # the listener, then its sessions (every sshd left in the namespace)
  local pid sessions=()
  pid=$(ssh_listener_pid)
  if [[ -n $pid ]]; then
    say "stopping sshd ($pid) of the cluster in $D"
    stop_pids "$pid" || true
  fi
  for pid in $(ns_pids); do
    [[ $(comm_of "$pid") == sshd* ]] && sessions+=("$pid")
  done
  if ((${#sessions[@]} > 0)); then
    say "stopping ${#sessions[@]} ssh sessions: ${sessions[*]}"
    stop_pids "${sessions[@]}" || true
  fi
  rm -f "$SSH_PIDFILE"
}

print_ssh_settings() {
  printf 'export SLURM_DEV_ROOT=%q\n' "$ROOT"
  printf 'export SLURM_DEV_SSH_PORT=%q\n' "$ssh_port"
  printf 'export SLURM_DEV_SSH_KEY=%q\n' "$SSH_CLIENT_KEY"
  printf 'export SLURM_DEV_SSH_KNOWN_HOSTS=%q\n' "$SSH_KNOWN_HOSTS"
  say "Slurm 24.11 runs in the chroot; reach it with: ssh -p $ssh_port -i $SSH_CLIENT_KEY" \
    "-o UserKnownHostsFile=$SSH_KNOWN_HOSTS -o StrictHostKeyChecking=yes root@127.0.0.1 squeue"
}
