"""What the system around the job writes: storage errors and Slurm's own notices (node death,
preemption, time limit, requeue, cancel).
"""

from __future__ import annotations

from recovery.simulator.logtext.context import (
    TORCH_DIR,
    FailureContext,
    rank_block,
    srun_exit,
    step_cancelled,
    traceback_lines,
    train_frames,
)
from recovery.simulator.logtext.layout import rank_line, slurm_time


def storage_io(context: FailureContext) -> list[str]:
    rng = context.rng
    head = context.hosts[0]
    target = f"{context.checkpoint_dir}/iter_{context.step + 1:07d}"
    ending = rng.choice(
        (
            f"OSError: [Errno 5] Input/output error: '{target}/mp_rank_00/model_optim_rng.pt'",
            f"OSError: [Errno 116] Stale file handle: '{target}'",
            "RuntimeError: [enforce fail at inline_container.cc:603] . PytorchStreamWriter failed "
            f"writing file data/{rng.randrange(4000)}: file write failed",
            f"OSError: [Errno 28] No space left on device: '{target}/mp_rank_00'",
        )
    )
    frames = [
        *train_frames(rng),
        (f"{TORCH_DIR}/serialization.py", 944, "save", "_save(obj, opened_zipfile, pickle_module)"),
    ]
    lines = [
        rank_line(
            0,
            context.at,
            head,
            f"saving checkpoint at iteration {context.step + 1:8d} to {context.checkpoint_dir}",
        )
    ]
    lines += rank_block(context, 0, head, [*traceback_lines(frames), ending], context.at + 2.0)
    lines += srun_exit(context, 0, head)
    lines.append(step_cancelled(context))
    return lines


def slurm_notice(context: FailureContext, why: str) -> list[str]:
    return [
        f"slurmstepd-{context.batch_host}: error: *** JOB {context.job_id} ON {context.batch_host} "
        f"CANCELLED AT {slurm_time(context.at)} DUE TO {why} ***"
    ]


def node_death(context: FailureContext) -> list[str]:
    lines = [f"srun: error: Node failure on {context.host}"]
    if context.node != 0:
        # The batch step lives on the first node; when that node died, nobody is left to write.
        lines += [
            *slurm_notice(context, "NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS"),
        ]
    return lines


def preemption(context: FailureContext) -> list[str]:
    return slurm_notice(context, "PREEMPTION")


def time_limit(context: FailureContext) -> list[str]:
    return slurm_notice(context, "TIME LIMIT")


def no_text(context: FailureContext) -> list[str]:
    return []


def requeue_notice(*, job_id: int, batch_host: str, at: float) -> str:
    """What slurmstepd writes when a running job is requeued by hand."""
    return (
        f"slurmstepd-{batch_host}: error: *** JOB {job_id} ON {batch_host} CANCELLED AT "
        f"{slurm_time(at)} DUE TO JOB REQUEUE ***"
    )


def cancel_notice(*, job_id: int, batch_host: str, at: float) -> str:
    return (
        f"slurmstepd-{batch_host}: error: *** JOB {job_id} ON {batch_host} CANCELLED AT "
        f"{slurm_time(at)} ***"
    )
