#!/usr/bin/env bash
# Record what a real Slurm cluster prints, for the unit tests of the Slurm reader (see README.md).
#
#   record.sh OUTDIR WORKDIR [COMMAND PREFIX...]
#
# OUTDIR   where the files go (one per case), e.g. tests/schedulers/data/slurm/24.11
# WORKDIR  a directory the cluster's jobs can write to (their --chdir), as the nodes see it
# The prefix runs a Slurm command on the cluster's host, e.g. `env SLURM_CONF=...` for a local
# cluster or `chroot ROOT /usr/bin/env SLURM_CONF=...` for one in a chroot. The cluster must be
# a fresh one (no other jobs in memory: `squeue --json` lists every job Slurm still knows),
# with the four nodes node001..node004 of deploy/slurm-dev/slurm.conf.in idle. It drains node003
# and sets node004 DOWN: restart the cluster afterwards. With NODE004_SLURMD_PID set, that
# slurmd is paused meanwhile, so that the node stays down (ReturnToService=2 brings a node back
# as soon as its slurmd answers).
set -euo pipefail

say() { echo "record.sh: $*" >&2; }
fail() {
  say "ERROR: $*"
  exit 1
}

(($# >= 2)) || fail "usage: record.sh OUTDIR WORKDIR [COMMAND PREFIX...]"
out=$1
work=$2
shift 2
prefix=("$@")
mkdir -p "$out"

slurm() { "${prefix[@]}" "$@"; }

save() {  # file name, command... -> the command's stdout, exactly as printed
  local name=$1
  shift
  slurm "$@" >"$out/$name" || fail "$* exited $?"
  say "wrote $out/$name"
}

state_of() {  # job id -> its JobState
  slurm scontrol show job "$1" | grep -o 'JobState=[A-Z_]*' | cut -d= -f2
}

field_of() {  # job id, field -> its value in `scontrol show job`
  slurm scontrol show job "$1" | grep -o "\\b$2=[^ ]*" | head -1 | cut -d= -f2-
}

wait_for() {  # what, seconds, command... -> until the command succeeds
  local what=$1 seconds=$2 i
  shift 2
  for ((i = 0; i < seconds * 5; i++)); do
    "$@" && return 0
    sleep 0.2
  done
  fail "timed out after $seconds s waiting for $what"
}

job_is() {  # job id, state
  [[ $(state_of "$1") == "$2" ]]
}

held_pending() {  # job id -> pending, restarted once, priority 0
  job_is "$1" PENDING && [[ $(field_of "$1" Restarts) == 1 && $(field_of "$1" Priority) == 0 ]]
}

released() {  # job id -> pending, priority no longer 0
  job_is "$1" PENDING && [[ $(field_of "$1" Priority) != 0 ]]
}

submit() {  # sbatch arguments... -> the job id
  local answer
  answer=$(slurm sbatch --parsable --chdir="$work" "$@") || fail "sbatch $* failed"
  echo "${answer%%;*}"
}

has_json_scontrol() { slurm scontrol --json show config >/dev/null 2>&1; }

save scontrol-version.txt scontrol version
save squeue-version.txt squeue --version

comment='{"nvidia-recovery":{"environment":"test","mode":"act"}}'

# (a) a running, opted-in job on two nodes
a=$(submit --job-name=opted-in --nodes=2 --requeue --open-mode=append --comment="$comment" \
  --output="$work/opted-in-%j.out" --wrap='srun sleep 600')
wait_for "job $a running" 30 job_is "$a" RUNNING
sleep 1
save squeue-running-opted-in.json squeue --json
has_json_scontrol && save scontrol-show-job-running.json scontrol --json show job "$a"

# (b) the same, requeued held
slurm scontrol requeuehold "$a"
wait_for "job $a requeued and held" 30 held_pending "$a"
save squeue-requeue-held.json squeue --json
has_json_scontrol && save scontrol-show-job-held.json scontrol --json show job "$a"

# (c) node002 excluded, released, running again elsewhere
slurm scontrol update JobId="$a" ExcNodeList=node002
slurm scontrol release "$a"
save squeue-excluded-released-pending.json squeue --json
wait_for "job $a pending with its priority back" 30 released "$a"
slurm scontrol update JobId="$a" StartTime=now
wait_for "job $a running again" 60 job_is "$a" RUNNING
sleep 1
save squeue-excluded-running-again.json squeue --json

# (d) a job that failed with exit code 3
b=$(submit --job-name=fails --output="$work/fails-%j.out" --wrap='exit 3')
wait_for "job $b failed" 30 job_is "$b" FAILED
save squeue-failed-exit3.json squeue --json
# 24.11's squeue --json lists only pending and running jobs unless asked for all states.
save squeue-all-states-failed-exit3.json squeue --json --states=all
has_json_scontrol && save scontrol-show-job-failed-exit3.json scontrol --json show job "$b"

# a cancelled job
c=$(submit --job-name=cancelled --output="$work/cancelled-%j.out" --wrap='sleep 600')
wait_for "job $c running" 30 job_is "$c" RUNNING
slurm scancel "$c"
wait_for "job $c cancelled" 30 job_is "$c" CANCELLED
save squeue-cancelled.json squeue --json
save squeue-all-states-cancelled.json squeue --json --states=all

# a job that may not be requeued
d=$(submit --job-name=no-requeue --no-requeue --comment="$comment" \
  --output="$work/no-requeue-%j.out" --wrap='sleep 600')
wait_for "job $d running" 30 job_is "$d" RUNNING
save squeue-no-requeue.json squeue --json

# an array job of three tasks
slurm scancel "$a" "$d"
e=$(submit --job-name=array --array=0-2 --comment="$comment" --output="$work/array-%A_%a.out" \
  --wrap='sleep 600')
wait_for "array $e running" 30 job_is "${e}_0" RUNNING
sleep 2
save squeue-array.json squeue --json
slurm scancel "$e"
wait_for "array $e cancelled" 30 job_is "${e}_0" CANCELLED
save squeue-all-states-after-all.json squeue --json --states=all

# a drained node and a down node
slurm scontrol update NodeName=node003 State=DRAIN Reason="recorded sample: drained"
if [[ -n ${NODE004_SLURMD_PID:-} ]]; then
  kill -STOP "$NODE004_SLURMD_PID"
  trap 'kill -CONT "$NODE004_SLURMD_PID"' EXIT
fi
slurm scontrol update NodeName=node004 State=DOWN Reason="recorded sample: down"
sleep 1
save sinfo-drained-down.json sinfo --json
if slurm scontrol --json show nodes >/dev/null 2>&1; then
  save scontrol-show-nodes-drained-down.json scontrol --json show nodes
fi
say "done"
