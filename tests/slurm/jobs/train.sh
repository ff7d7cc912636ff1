#!/usr/bin/env bash
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=1
# A stand-in for a Megatron-LM training job, for tests against the development cluster.
# The submitter gives --output. It resumes from the newest checkpoint in CKPT_DIR (files named
# step_<N> holding N), prints Megatron's progress lines, saves a checkpoint every CKPT_EVERY
# steps, and exits 0 after TOTAL_STEPS.
#
# CKPT_DIR      checkpoint directory shared by all nodes (required)
# TOTAL_STEPS   default 40
# STEP_SECONDS  default 0.5
# CKPT_EVERY    default 5
# FAIL_AT_STEP  on the first attempt only (SLURM_RESTART_COUNT unset or 0), die at this step
#               with a CUDA out-of-memory error and exit 1
set -euo pipefail

: "${CKPT_DIR:?CKPT_DIR must name the checkpoint directory}"
total=${TOTAL_STEPS:-40}
step_seconds=${STEP_SECONDS:-0.5}
ckpt_every=${CKPT_EVERY:-5}
fail_at=${FAIL_AT_STEP:-}
restarts=${SLURM_RESTART_COUNT:-0}
node=${SLURMD_NODENAME:-$(hostname)}
global_batch=256

mkdir -p "$CKPT_DIR"

# The newest checkpoint is the highest step whose file holds that step: a file cut short by a
# kill does not count.
resume=0
for file in "$CKPT_DIR"/step_*; do
  [[ -f $file ]] || continue
  n=${file##*/step_}
  [[ $n =~ ^[0-9]+$ ]] || continue
  content=$(<"$file")
  if [[ $content == "$n" ]] && ((10#$n > resume)); then
    resume=$((10#$n))
  fi
done

stamp() { date '+%Y-%m-%d %H:%M:%S'; }

if ((resume > 0)); then
  echo "[$(stamp)] resuming from checkpoint at iteration $resume" \
    "(SLURM_RESTART_COUNT=$restarts, SLURMD_NODENAME=$node, SLURM_JOB_ID=${SLURM_JOB_ID:-})"
else
  echo "[$(stamp)] starting from scratch" \
    "(SLURM_RESTART_COUNT=$restarts, SLURMD_NODENAME=$node, SLURM_JOB_ID=${SLURM_JOB_ID:-})"
fi

out_of_memory() {
  cat >&2 <<EOF
Traceback (most recent call last):
  File "/workspace/Megatron-LM/pretrain_gpt.py", line 278, in <module>
    pretrain(
  File "/workspace/Megatron-LM/megatron/training/training.py", line 386, in pretrain
    iteration, num_floating_point_operations_so_far = train(
  File "/workspace/Megatron-LM/megatron/training/training.py", line 1385, in train
    train_step(forward_step_func,
  File "/workspace/Megatron-LM/megatron/core/tensor_parallel/layers.py", line 640, in forward
    output = torch.matmul(total_input, weight.t())
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.08 GiB memory in use. Of the allocated memory 74.21 GiB is allocated by PyTorch, and 2.37 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)
EOF
}

for ((step = resume + 1; step <= total; step++)); do
  started=$(date +%s%N)
  sleep "$step_seconds"
  if [[ -n $fail_at ]] && ((step == fail_at && restarts == 0)); then
    out_of_memory
    exit 1
  fi
  elapsed_us=$((($(date +%s%N) - started) / 1000))
  awk -v step="$step" -v total="$total" -v batch="$global_batch" -v us="$elapsed_us" 'BEGIN {
    loss = 2.2 + 8.6 * exp(-step / 15.0)
    printf " iteration %8d/ %8d | consumed samples: %12d | elapsed time per iteration (ms): %.1f" \
      " | learning rate: %.3E | global batch size: %5d | lm loss: %.6E | loss scale: 1.0" \
      " | grad norm: %.3f | number of skipped iterations:   0 | number of nan iterations:   0 |\n",
      step, total, step * batch, us / 1000.0, 1.5e-4, batch, loss, 0.2 + 1.0 / step
  }'
  if ((step % ckpt_every == 0)); then
    printf ' saving checkpoint at iteration %8d to %s\n' "$step" "$CKPT_DIR"
    # Write then rename, so that a kill mid-write never leaves a checkpoint that looks whole.
    printf '%d\n' "$step" >"$CKPT_DIR/.step_$step.tmp"
    mv -f "$CKPT_DIR/.step_$step.tmp" "$CKPT_DIR/step_$step"
    printf '  successfully saved checkpoint from iteration %8d to %s\n' "$step" "$CKPT_DIR"
  fi
done

echo "[$(stamp)] training finished at iteration $total"
