#!/usr/bin/env bash
# Register node-down.sh with slurmctld as a permanent "node down" trigger. Run it once as
# SlurmUser (or root, when SlurmUser is root) on a host where strigger reaches slurmctld.
# Running it again changes nothing. Triggers are kept in slurmctld's saved state.
#
# install-strigger.sh [path of node-down.sh]   (default: the one next to this script)
set -euo pipefail

program=$(readlink -f "${1:-$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/node-down.sh}")
if [[ ! -x $program ]]; then
  echo "install-strigger.sh: $program is not an executable file" >&2
  exit 1
fi
if strigger --get --node --down 2>/dev/null | grep -qF -- "$program"; then
  echo "install-strigger.sh: the node-down trigger for $program is already set"
  exit 0
fi
strigger --set --node --down --flags=PERM --program="$program"
echo "install-strigger.sh: set a permanent node-down trigger running $program"
strigger --get --node --down
