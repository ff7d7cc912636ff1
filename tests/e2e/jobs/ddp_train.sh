#!/usr/bin/env bash
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --nodes=3
#SBATCH --ntasks-per-node=1
# Launches ddp_train.py once per node, the way a multi-node PyTorch job is started under Slurm.
# Every "node" of the test cluster is this machine, so the rendezvous is on 127.0.0.1 and each
# job (and each of its attempts) takes a port of its own. The submitter gives --output, CKPT_DIR,
# PYTHON (the interpreter with torch) and TRAIN_PROGRAM (ddp_train.py: Slurm runs a copy of this
# script from its spool directory, so the program cannot be found next to it).
set -euo pipefail

: "${PYTHON:?PYTHON must name the interpreter with torch installed}"
: "${CKPT_DIR:?CKPT_DIR must name the checkpoint directory}"
: "${TRAIN_PROGRAM:?TRAIN_PROGRAM must name ddp_train.py}"
mkdir -p "$CKPT_DIR"

restarts=${SLURM_RESTART_COUNT:-0}
export MASTER_ADDR=127.0.0.1
# Below the kernel's ephemeral range (32768-60999 by default), where the ranks' own connections
# would take it, and away from the test clusters' Slurm ports (6817, 17001-17604). The test
# clusters run side by side on this host's loopback, each handing out job ids from a slot of
# 15,000,000 of its own (deploy/slurm-dev/up.sh): each slot's jobs take 2,500 ports of their own.
id_slot=$((SLURM_JOB_ID / 15000000))
export MASTER_PORT=$((20000 + id_slot * 2500 + (SLURM_JOB_ID % 250) * 10 + restarts % 10))
export GLOO_SOCKET_IFNAME=lo
export OMP_NUM_THREADS=1
export PYTHONUNBUFFERED=1

echo "$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ) ${SLURMD_NODENAME:-}: job $SLURM_JOB_ID attempt $((restarts + 1))" \
  "on $SLURM_JOB_NODELIST, rendezvous $MASTER_ADDR:$MASTER_PORT"
# One bad rank ends the step at once instead of leaving the others waiting in a collective.
exec srun -l --kill-on-bad-exit=1 --ntasks-per-node=1 "$PYTHON" "$TRAIN_PROGRAM"
