#!/usr/bin/env bash
# Stop the development sshd that up.sh started in SSH_DEV_DIR (default var/ssh-dev): the
# listener named in its pid file, and the sessions it left open with whatever they run.
# SIGTERM first, SIGKILL after 5 s. Only processes that carry this server's marker (see
# common.sh), and what runs below them, are touched. Keys are kept. Exits 0 when nothing of the
# server is left running; running it again does nothing.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if [[ ! -d $D ]]; then
  exit 0
fi

pid=$(listener_pid)
if [[ -n $pid ]]; then
  say "stopping sshd ($pid) in $D"
  # Stopped first, so that it accepts no new connection while the sessions go.
  stop_pids "$pid" || true
fi
mapfile -t sessions < <(server_pids)
if ((${#sessions[@]} > 0)); then
  say "stopping ${#sessions[@]} processes of its sessions: ${sessions[*]}"
  stop_pids "${sessions[@]}" || true
fi
rm -f "$PIDFILE"

remaining=$(server_pids | tr '\n' ' ')
if [[ -n ${remaining// /} ]]; then
  say "ERROR: still running: $remaining"
  exit 1
fi
