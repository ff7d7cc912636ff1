# shellcheck shell=bash
# Shared by up.sh and down.sh (sourced, not run): where the development sshd lives and how to
# find the processes that belong to it.
#
# SSH_DEV_DIR   runtime directory (default <repo>/var/ssh-dev): keys, sshd_config, pid file, log
# up.sh starts sshd with -E $D/sshd.log, and every sshd process of that server (the listener
# and one per connection, which outlive the listener) keeps that log file open: that is how
# down.sh tells this server's processes from another's. (A marker in the environment would not
# do: sshd writes its process title over it.)

export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH

SSH_DEV_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
D=$(realpath -m -- "${SSH_DEV_DIR:-$SSH_DEV_REPO/var/ssh-dev}")
# shellcheck disable=SC2034  # used by up.sh and down.sh
{
  CONFIG=$D/sshd_config
  PIDFILE=$D/sshd.pid
  HOST_KEY=$D/ssh_host_ed25519_key
  CLIENT_KEY=$D/client_ed25519
  AUTHORIZED_KEYS=$D/authorized_keys
  KNOWN_HOSTS=$D/known_hosts
  LOG=$D/sshd.log
}

# shellcheck source=SCRIPTDIR/../dev/process.sh
source "$(dirname "${BASH_SOURCE[0]}")/../dev/process.sh"

ours() {  # pid -> an sshd process of this server
  local fd
  [[ $(cat "/proc/$1/comm" 2>/dev/null) == sshd ]] || return 1
  for fd in "/proc/$1/fd/"*; do
    [[ $(readlink "$fd" 2>/dev/null) == "$LOG" ]] && return 0
  done
  return 1
}

listener_pid() {  # the pid of this server's listening sshd, when it runs
  local pid
  pid=$(pid_in "$PIDFILE")
  [[ -n $pid ]] && alive "$pid" && ours "$pid" && echo "$pid"
  return 0
}

server_pids() {  # every live process of this server: its sshd processes and what runs below them
  local pid ppid state rest changed=1
  local -A parent=() mine=()
  # /proc/PID/stat is "pid (comm) state ppid ...", and comm may itself hold spaces.
  while read -r pid ppid state; do
    [[ $state == [ZX] ]] && continue
    parent[$pid]=$ppid
    ours "$pid" && mine[$pid]=1
  done < <(awk '{
    close_paren = match($0, /\) [A-Za-z] /)
    split(substr($0, close_paren + 2), f, " ")
    print $1, f[2], f[1]
  }' /proc/[0-9]*/stat 2>/dev/null || true)
  while ((changed)); do
    changed=0
    for pid in "${!parent[@]}"; do
      [[ -z ${mine[$pid]:-} && -n ${mine[${parent[$pid]}]:-} ]] || continue
      mine[$pid]=1
      changed=1
    done
  done
  for pid in "${!mine[@]}"; do alive "$pid" && echo "$pid"; done
  return 0
}

stop_pids() {  # pids... -> SIGTERM, wait up to 5 s, then SIGKILL whatever is left
  local pid left=() i alive_any
  (($# > 0)) || return 0
  kill -TERM "$@" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    left=()
    for pid in "$@"; do alive "$pid" && left+=("$pid"); done
    ((${#left[@]} == 0)) && return 0
    sleep 0.1
  done
  say "still running after 5 s, sending SIGKILL: ${left[*]}"
  kill -KILL "${left[@]}" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    alive_any=0
    for pid in "${left[@]}"; do alive "$pid" && alive_any=1; done
    ((alive_any)) || return 0
    sleep 0.1
  done
  say "could not stop: ${left[*]}"
  return 1
}

ssh_answers() {  # port -> an SSH server answers on 127.0.0.1:port (it sends its banner first)
  local banner=""
  # shellcheck disable=SC2016  # $1 is expanded by the inner bash
  banner=$(timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" && head -c 4 <&3' _ "$1" \
    2>/dev/null) || true
  [[ $banner == SSH- ]]
}

port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
