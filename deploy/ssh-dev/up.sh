#!/usr/bin/env bash
# Start an sshd on 127.0.0.1 for development and tests of the SSH transport: key logins only,
# with its own host key, client key, authorized_keys and known_hosts in SSH_DEV_DIR. Installs
# openssh-server when /usr/sbin/sshd is missing. Keys are generated once and kept; running it
# again while the server is up with the same settings does nothing.
#
# Prints the lines to run in a shell afterwards:  eval "$(deploy/ssh-dev/up.sh)"
#   SSH_DEV_PORT, SSH_DEV_KEY (the client's private key), SSH_DEV_KNOWN_HOSTS
#
# SSH_DEV_DIR    runtime directory (default var/ssh-dev)
# SSH_DEV_PORT   port on 127.0.0.1 (default 2222)
# SLURM_CONF     when set, sshd gives it to every session (SetEnv), so squeue and scontrol
#                reach that cluster: run  eval "$(deploy/slurm-dev/up.sh)"  first
# Run as root (the key opens the account that ran up.sh). Two servers can run side by side
# when their directories and ports differ.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

port=${SSH_DEV_PORT:-2222}
user=$(id -un)
started_at=$(date +%s.%N)

elapsed() { awk -v a="$started_at" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }

fail() {  # message
  say "ERROR: $1"
  if [[ -s $LOG ]]; then
    echo "  --- tail of $LOG" >&2
    tail -n 15 "$LOG" | sed 's/^/    /' >&2
  fi
  exit 1
}

print_settings() {
  printf 'export SSH_DEV_PORT=%q\n' "$port"
  printf 'export SSH_DEV_KEY=%q\n' "$CLIENT_KEY"
  printf 'export SSH_DEV_KNOWN_HOSTS=%q\n' "$KNOWN_HOSTS"
  say "try: ssh -p $port -i $CLIENT_KEY -o UserKnownHostsFile=$KNOWN_HOSTS" \
    "-o StrictHostKeyChecking=yes -o BatchMode=yes $user@127.0.0.1 squeue"
}

install_packages() {
  [[ -x /usr/sbin/sshd ]] && command -v ssh-keygen >/dev/null && return 0
  if ! command -v apt-get >/dev/null; then
    fail "/usr/sbin/sshd is missing; install openssh-server"
  fi
  local apt_log=$D/apt.log
  say "installing openssh-server"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq --no-install-recommends openssh-server >"$apt_log" 2>&1; then
    say "apt-get install failed; running apt-get update first"
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends openssh-server; } \
      >>"$apt_log" 2>&1 || { LOG=$apt_log fail "could not install openssh-server"; }
  fi
}

ensure_key() {  # private key file, comment -> generated when missing; its .pub always present
  local key=$1 comment=$2
  if [[ ! -s $key ]]; then
    say "generating $key"
    rm -f "$key" "$key.pub"
    ssh-keygen -q -t ed25519 -N '' -C "$comment" -f "$key" </dev/null
  elif [[ ! -s $key.pub ]]; then
    ssh-keygen -y -f "$key" >"$key.pub"
  fi
  chmod 600 "$key"
}

write_config() {  # target file
  local conf setenv
  if [[ -n ${SLURM_CONF:-} ]]; then
    if [[ $SLURM_CONF == *[\"$'\n\\']* ]]; then
      fail "SLURM_CONF holds a quote, backslash or newline: $SLURM_CONF"
    fi
    setenv="SetEnv \"SLURM_CONF=$SLURM_CONF\""
  else
    setenv="# No SetEnv: SLURM_CONF was not set when up.sh ran."
  fi
  conf=$(<"$(dirname "${BASH_SOURCE[0]}")/sshd_config.in")
  conf=${conf//@DIR@/"$D"}
  conf=${conf//@PORT@/"$port"}
  conf=${conf//@USER@/"$user"}
  conf=${conf//@SETENV@/"$setenv"}
  if [[ $conf == *@[A-Z_]*@* ]]; then
    fail "sshd_config.in has a field up.sh does not fill: $(grep -o '@[A-Z_]*@' <<<"$conf" | head -1)"
  fi
  printf '%s\n' "$conf" >"$1"
}

if [[ ! $port =~ ^[0-9]+$ ]] || ((port < 1 || port > 65535)); then
  fail "SSH_DEV_PORT must be a port number, not '$port'"
fi
if [[ $(id -u) -ne 0 ]]; then
  fail "run as root (sshd needs /run/sshd and its privilege separation user)"
fi
if [[ $D == *[[:space:]\"\\]* ]]; then
  fail "SSH_DEV_DIR may not hold spaces, quotes or backslashes: $D"
fi

mkdir -p "$D"
chmod 700 "$D"
install_packages

ensure_key "$HOST_KEY" "ssh-dev host key"
ensure_key "$CLIENT_KEY" "ssh-dev client key"
# Both follow from the keys and the port, so they are rewritten every time.
cp "$CLIENT_KEY.pub" "$AUTHORIZED_KEYS.tmp" && mv "$AUTHORIZED_KEYS.tmp" "$AUTHORIZED_KEYS"
host_name="[127.0.0.1]:$port"
((port == 22)) && host_name=127.0.0.1
read -r key_type key_data _ <"$HOST_KEY.pub"
echo "$host_name $key_type $key_data" >"$KNOWN_HOSTS.tmp" && mv "$KNOWN_HOSTS.tmp" "$KNOWN_HOSTS"

# sshd (even sshd -t) needs its privilege separation directory.
mkdir -p /run/sshd
chmod 755 /run/sshd
write_config "$CONFIG.new"
if ! /usr/sbin/sshd -t -f "$CONFIG.new" 2>"$D/config-check.log"; then
  LOG=$D/config-check.log fail "sshd refuses the configuration in $CONFIG.new"
fi

pid=$(listener_pid)
if [[ -n $pid ]]; then
  if cmp -s "$CONFIG.new" "$CONFIG" && ssh_answers "$port"; then
    rm -f "$CONFIG.new"
    say "sshd ($pid) in $D is already up on 127.0.0.1:$port"
    print_settings
    exit 0
  fi
  # Open sessions carry on; down.sh stops them.
  say "restarting sshd ($pid): its settings changed"
  stop_pids "$pid" || fail "could not stop sshd ($pid)"
fi

if port_taken "$port"; then
  fail "port $port on 127.0.0.1 is taken (another sshd? stop it with its down.sh, or set SSH_DEV_PORT)"
fi

mv "$CONFIG.new" "$CONFIG"
rm -f "$PIDFILE"
: >"$LOG"
say "starting sshd on 127.0.0.1:$port"
# The log file (-E) is also how common.sh recognises this server's processes.
env -i PATH="$PATH" /usr/sbin/sshd -f "$CONFIG" -E "$LOG" </dev/null \
  || fail "sshd did not start"
for ((i = 0; i < 100; i++)); do
  pid=$(listener_pid)
  if [[ -n $pid ]] && ssh_answers "$port"; then
    say "sshd ($pid) in $D up in $(elapsed) s"
    print_settings
    exit 0
  fi
  sleep 0.1
done
pid=$(listener_pid)
[[ -n $pid ]] && stop_pids "$pid"
fail "sshd did not answer on 127.0.0.1:$port within 10 s"
