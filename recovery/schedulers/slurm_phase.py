"""Slurm's job states as phases: what the loop reads of a Slurm job (and of the simulated one).

The states are those ``slurm_json.read_job_state`` gives: a base state, or COMPLETING while the
job's processes are ended and its nodes released. CONFIGURING and REQUEUED are flags Slurm
shows beside a base state, mapped here too for a reader that gives them as the state.
"""

from __future__ import annotations

from recovery.schedulers.phase import Phase

SLURM_PHASES = {
    "PENDING": Phase.PENDING,
    # Slurm shows REQUEUED between a requeue and the job's next wait in the queue.
    "REQUEUED": Phase.PENDING,
    # Nodes being booted or set up for the job: allocated, the loop treats it as running.
    "CONFIGURING": Phase.RUNNING,
    "RUNNING": Phase.RUNNING,
    "SUSPENDED": Phase.SUSPENDED,
    "COMPLETING": Phase.ENDING,
    "COMPLETED": Phase.COMPLETED,
    "FAILED": Phase.FAILED,
    "NODE_FAIL": Phase.NODE_FAILED,
    # The nodes could not be booted for the job: a node failure before the job ran.
    "BOOT_FAIL": Phase.NODE_FAILED,
    "OUT_OF_MEMORY": Phase.OUT_OF_MEMORY,
    "TIMEOUT": Phase.TIMED_OUT,
    # The job's --deadline passed: it ran out of time as a time limit would end it.
    "DEADLINE": Phase.TIMED_OUT,
    "PREEMPTED": Phase.PREEMPTED,
    "CANCELLED": Phase.CANCELLED,
}


def slurm_phase(state: str | None) -> Phase | None:
    """The phase of a Slurm job in ``state``; None when the state could not be read."""
    if state is None:
        return None
    return SLURM_PHASES.get(state, Phase.UNKNOWN)
