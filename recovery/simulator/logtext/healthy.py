"""What a healthy job writes: start-up chatter, progress, checkpoints, the end of training."""

from __future__ import annotations

import math
import random

from recovery.simulator.logtext.layout import (
    GPUS_PER_NODE,
    NCCL_VERSION,
    host_line,
    node_ip,
    pci_bus,
    random_pid,
    rank_line,
)


def startup_lines(
    *,
    hosts: list[str],
    at: float,
    restart: int,
    resume_step: int,
    checkpoint_dir: str,
    rng: random.Random,
) -> list[str]:
    """What every attempt prints before its first step: resume notice and NCCL set-up."""
    head = hosts[0]
    if resume_step > 0:
        said = f"resuming from checkpoint at iteration {resume_step} (restart {restart})"
        lines = [
            rank_line(
                0, at, head, f"loading checkpoint from {checkpoint_dir} at iteration {resume_step}"
            ),
            rank_line(0, at + 0.4, head, said),
        ]
    else:
        lines = [rank_line(0, at, head, f"starting from scratch (restart {restart})")]
    at += 0.8
    lines.append(
        rank_line(
            0,
            at,
            head,
            f"{head}:{random_pid(rng)}:{random_pid(rng)} [0] NCCL INFO NCCL version "
            f"{NCCL_VERSION}+cuda12.4",
        )
    )
    nranks = len(hosts) * GPUS_PER_NODE
    for index, host in enumerate(hosts):
        rank = index * GPUS_PER_NODE
        pid = random_pid(rng)
        tid = pid + rng.randint(40, 90)
        ip = node_ip(host)
        prefix = f"{host}:{pid}:{tid} [0] NCCL INFO"
        stamp_at = at + 0.01 * index
        lines.append(
            rank_line(
                rank,
                stamp_at,
                host,
                f"{host}:{pid}:{pid} [0] NCCL INFO Bootstrap : Using ib0:{ip}<0>",
            )
        )
        lines.append(
            rank_line(
                rank,
                stamp_at,
                host,
                f"{prefix} NET/IB : Using [0]mlx5_0:1/IB "
                f"[1]mlx5_1:1/IB [2]mlx5_2:1/IB [3]mlx5_3:1/IB ; OOB ib0:{ip}<0>",
            )
        )
        lines.append(
            rank_line(
                rank,
                stamp_at + 0.2,
                host,
                f"{prefix} Channel 00/32 : "
                f"{rank} -> {(rank + GPUS_PER_NODE) % nranks} via NET/IB/0",
            )
        )
        lines.append(
            rank_line(
                rank,
                stamp_at + 0.4,
                host,
                f"{prefix} comm 0x{rng.getrandbits(40):x} "
                f"rank {rank} nranks {nranks} cudaDev 0 busId "
                f"{pci_bus(host, 0)}000 - Init COMPLETE",
            )
        )
    return lines


def progress_line(
    *,
    rank: int,
    host: str,
    at: float,
    step: int,
    loss: float,
    tokens_per_second: float,
    memory_gib: float,
) -> str:
    """A torchtitan progress line: this rank's own loss view and compute throughput."""
    tflops = tokens_per_second * 0.0595
    mfu = tflops / 989.0 * 100
    return rank_line(
        rank,
        at,
        host,
        f"step: {step:5d}  loss: {loss:7.4f}  memory: {memory_gib:5.2f}GiB"
        f"({memory_gib / 79.1 * 100:.2f}%)  tps: {tokens_per_second:,.0f}  "
        f"tflops: {tflops:.2f}  mfu: {mfu:.2f}%",
    )


def training_loss(step: int, rng: random.Random) -> float:
    """A pre-training loss curve: fast early drop, slow tail, a little noise."""
    return 2.1 + 8.8 * math.exp(-step / 350) + 0.6 * math.exp(-step / 6000) + rng.gauss(0, 0.02)


def checkpoint_lines(*, host: str, at: float, step: int, checkpoint_dir: str) -> list[str]:
    """Megatron's save messages from rank 0; the second one, at ``at``, marks it complete."""
    return [
        rank_line(
            0, at - 0.9, host, f"saving checkpoint at iteration {step:8d} to {checkpoint_dir}"
        ),
        rank_line(
            0,
            at,
            host,
            f"successfully saved checkpoint from iteration {step:8d} to {checkpoint_dir}",
        ),
    ]


def finished_line(*, host: str, at: float, step: int) -> str:
    return rank_line(0, at, host, f"training finished at iteration {step}")


def thermal_lines(*, host: str, at: float, gpu: int) -> list[str]:
    """A node monitor noticing the slowdown; a warning, never a failure by itself."""
    return [host_line(at, host, f"GPU {gpu}: Clocks Event Reasons: HW Thermal Slowdown: Active")]
