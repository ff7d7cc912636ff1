"""Where a job is in its life, in words every scheduler's adapter maps its own states to.

The loop, its monitors and the findings read only a job's ``Phase`` (``JobInfo.phase``); the
scheduler's own word stays beside it (``JobInfo.native_state``) for people to read and for the
scheduler's own adapter and executor. Each adapter maps its states here
(``recovery/schedulers/slurm_phase.py`` for Slurm and the simulated Slurm); a state it does not
know is ``UNKNOWN``, never a guess.

The values are stored (an attempt's scheduler ending): they must not change.
"""

from __future__ import annotations

from recovery.schedulers.compat import StrEnum


class Phase(StrEnum):
    # Waiting for an allocation: new, requeued or held.
    PENDING = "pending"
    # Allocated and running (or being set up on its nodes).
    RUNNING = "running"
    # Stopped by the scheduler on its nodes, to be resumed there.
    SUSPENDED = "suspended"
    # Its processes are being ended and its nodes released: after an ending, or a requeue,
    # that the scheduler has not finished carrying out.
    ENDING = "ending"
    COMPLETED = "completed"
    # The job's own processes failed (a non-zero exit or a signal).
    FAILED = "failed"
    # A node of the allocation failed, or could not be booted for it.
    NODE_FAILED = "node_failed"
    # The scheduler killed it for using more host memory than it asked for.
    OUT_OF_MEMORY = "out_of_memory"
    # It reached its time limit or its deadline.
    TIMED_OUT = "timed_out"
    # The scheduler took its nodes for other work.
    PREEMPTED = "preempted"
    # Cancelled, by its user, an operator or recovery.
    CANCELLED = "cancelled"
    # A state the adapter does not know: nothing is concluded from it.
    UNKNOWN = "unknown"


# An attempt that is over: the scheduler says how it ended.
ENDED_PHASES = frozenset(
    {
        Phase.COMPLETED,
        Phase.FAILED,
        Phase.NODE_FAILED,
        Phase.OUT_OF_MEMORY,
        Phase.TIMED_OUT,
        Phase.PREEMPTED,
        Phase.CANCELLED,
    }
)
# Endings that say on their own why the attempt ended (a bare FAILED says only that it did).
TELLING_ENDINGS = frozenset(
    {Phase.NODE_FAILED, Phase.OUT_OF_MEMORY, Phase.TIMED_OUT, Phase.PREEMPTED}
)
# Phases in which the job holds the nodes the scheduler lists for it.
HOLDS_ITS_NODES = frozenset({Phase.RUNNING, Phase.ENDING}) | ENDED_PHASES
