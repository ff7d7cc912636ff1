#!/usr/bin/env bash
# Slurm EpilogSlurmctld: tell Workload Recovery that a job ended, so that it polls the cluster
# now instead of at its next poll. Runs on the slurmctld host as SlurmUser after every job (and
# after every requeue of one). It never fails or holds up the job: it gives the request a few
# seconds, logs what happened to syslog (tag workload-recovery-hook), and exits 0 whatever
# happened. Configuration: see hook-common.sh and README.md.
#
# slurmctld 22.05 gives it SLURM_JOB_ID, SLURM_JOB_EXIT_CODE (raw wait status, 768 = exit 3),
# SLURM_JOB_EXIT_CODE2 (exit:signal), SLURM_JOB_NODELIST, SLURM_JOB_RESTART_COUNT and more, but
# not the job's final state (scontrol still shows COMPLETING at this point), so no state is
# sent: the poll reads it from Slurm.
set -uo pipefail

# shellcheck source-path=SCRIPTDIR source=hook-common.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/hook-common.sh" || exit 0

main() {
  local job_id=${SLURM_JOB_ID:-${SLURM_JOBID:-}} body
  if [[ ! $job_id =~ ^[0-9]+$ ]]; then
    hook_log "no SLURM_JOB_ID: not run by slurmctld as EpilogSlurmctld?"
    return 0
  fi
  hook_load_config || return 0
  body="{\"job_id\": $(hook_json_string "$job_id")"
  [[ ${SLURM_JOB_EXIT_CODE:-} =~ ^-?[0-9]+$ ]] \
    && body+=", \"exit_code\": $SLURM_JOB_EXIT_CODE"
  [[ ${SLURM_JOB_EXIT_CODE2:-} =~ ^[0-9]+:[0-9]+$ ]] \
    && body+=", \"exit_code_text\": $(hook_json_string "$SLURM_JOB_EXIT_CODE2")"
  [[ ${SLURM_JOB_RESTART_COUNT:-} =~ ^[0-9]+$ ]] \
    && body+=", \"restart_count\": $SLURM_JOB_RESTART_COUNT"
  [[ ${SLURM_JOB_NODELIST:-} =~ $HOOK_NODELIST_RE ]] \
    && body+=", \"nodes\": $(hook_json_string "$SLURM_JOB_NODELIST")"
  body+="}"
  hook_post scheduler/job-ended/ "$body" || true
}

main "$@"
exit 0
