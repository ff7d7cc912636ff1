#!/usr/bin/env bash
# strigger program for "node down": tell Workload Recovery which nodes went down, so that it
# polls the cluster now. strigger passes the nodes as one hostlist expression (node[001-004]).
# Installed by install-strigger.sh; like the epilog it always exits 0 and logs to syslog.
set -uo pipefail

# shellcheck source-path=SCRIPTDIR source=hook-common.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/hook-common.sh" || exit 0

main() {
  local nodes=${1:-} node reason sent=0
  if [[ ! $nodes =~ $HOOK_NODELIST_RE ]]; then
    hook_log "node-down: expected a hostlist argument, got '${nodes:0:100}'"
    return 0
  fi
  hook_load_config || return 0
  # The trigger means "went down": that is the state sent. Each node's reason is added when
  # sinfo answers (best effort, bounded). The node may be back already (ReturnToService).
  while IFS='|' read -r node reason; do
    [[ $node =~ ^[A-Za-z0-9._-]+$ ]] || continue
    [[ $reason == none ]] && reason=""
    hook_post scheduler/node-down/ "{\"node\": $(hook_json_string "$node"), \"state\": \"DOWN\", \
\"reason\": $(hook_json_string "${reason:0:250}")}" || true
    sent=1
  done < <(timeout 5 sinfo -h -N -n "$nodes" -o '%N|%E' 2>/dev/null | sort -u)
  if ((!sent)); then
    hook_post scheduler/node-down/ "{\"node\": $(hook_json_string "$nodes"), \"state\": \"DOWN\"}" \
      || true
  fi
}

main "$@"
exit 0
