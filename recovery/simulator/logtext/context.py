"""Where and when a failure happens, and the pieces of text many failures share."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime

from recovery.simulator.logtext.layout import GPUS_PER_NODE, rank_line, slurm_time


@dataclass
class FailureContext:
    """Where and when a failure happens; ``rng`` varies its details."""

    job_id: int
    hosts: list[str]
    node: int  # index in ``hosts`` of the node that fails (or of the rank that raises)
    step: int
    at: float
    rng: random.Random
    checkpoint_dir: str = "/checkpoints"
    xid: int | None = None

    @property
    def host(self) -> str:
        return self.hosts[self.node]

    @property
    def batch_host(self) -> str:
        return self.hosts[0]

    def gpu(self) -> int:
        return self.rng.randrange(GPUS_PER_NODE)

    def rank_of(self, gpu: int, node: int | None = None) -> int:
        return (self.node if node is None else node) * GPUS_PER_NODE + gpu

    def peers(self, count: int) -> list[tuple[int, str]]:
        """A few ranks on other nodes, as (rank, host)."""
        others = [index for index in range(len(self.hosts)) if index != self.node] or [self.node]
        chosen = []
        for _ in range(count):
            node = self.rng.choice(others)
            chosen.append(
                (node * GPUS_PER_NODE + self.rng.randrange(GPUS_PER_NODE), self.hosts[node])
            )
        return chosen


def traceback_lines(frames: list[tuple[str, int, str, str]]) -> list[str]:
    lines = ["Traceback (most recent call last):"]
    for path, number, function, code in frames:
        lines.append(f'  File "{path}", line {number}, in {function}')
        lines.append(f"    {code}")
    return lines


TRAIN_SCRIPT = "/workspace/megatron/pretrain_gpt.py"
TRAINING_MODULE = "/workspace/megatron/megatron/training/training.py"
TORCH_DIR = "/usr/local/lib/python3.11/site-packages/torch"


def train_frames(rng: random.Random) -> list[tuple[str, int, str, str]]:
    return [
        (TRAIN_SCRIPT, rng.choice((312, 318, 334)), "<module>", "pretrain("),
        (
            TRAINING_MODULE,
            rng.choice((386, 391)),
            "pretrain",
            "iteration, num_floating_point_operations_so_far = train(",
        ),
        (TRAINING_MODULE, rng.choice((1346, 1352, 1402)), "train", "train_step(forward_step_func,"),
    ]


def rank_block(
    context: FailureContext, rank: int, host: str, lines: list[str], at: float
) -> list[str]:
    return [rank_line(rank, at + 0.001 * index, host, line) for index, line in enumerate(lines)]


def srun_exit(
    context: FailureContext, rank: int, host: str, what: str = "Exited with exit code 1"
) -> list[str]:
    return [
        f"srun: error: {host}: task {rank}: {what}",
        "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.",
    ]


def step_cancelled(context: FailureContext) -> str:
    return (
        f"slurmstepd-{context.batch_host}: error: *** STEP {context.job_id}.0 ON "
        f"{context.batch_host} CANCELLED AT {slurm_time(context.at + 2)} ***"
    )


def watchdog_timeouts(context: FailureContext, count: int, at: float) -> list[str]:
    """What the other ranks print when a peer stops taking part in collectives."""
    seq = context.rng.randint(20_000, 900_000)
    timeout_ms = context.rng.choice((600_000, 1_800_000))
    moment = datetime.fromtimestamp(at, tz=UTC)
    lines = []
    for rank, host in context.peers(count):
        lines.append(
            rank_line(
                rank,
                at,
                host,
                f"[rank{rank}]:[E{moment:%m%d} {moment:%H:%M:%S}.{moment.microsecond:06d} "
                f"{context.rng.randint(100_000, 999_999)} ProcessGroupNCCL.cpp:616] [Rank {rank}] "
                f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, "
                f"OpType=ALLREDUCE, NumelIn={context.rng.choice((1048576, 4194304, 67108864))}, "
                f"NumelOut=1048576, Timeout(ms)={timeout_ms}) ran for "
                f"{timeout_ms + context.rng.randint(5, 900)} milliseconds before timing out.",
            )
        )
    return lines
