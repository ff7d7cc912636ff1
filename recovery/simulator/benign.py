"""What healthy training jobs do that can look like trouble, and how often the simulator makes
them do it.

A false action is an action on a job or node that had no real fault. A healthy job gives the
loop plenty of chances for one: it prints tracebacks it handles, warnings and NCCL chatter, skips
fp16 steps on a loss-scale overflow, goes quiet for an evaluation or a long checkpoint, waits
for a slow data loader, has a slow rank for a minute; around it, administrators requeue jobs
and drain nodes, the scheduler preempts, users cancel, and the node's kernel log shows driver
messages and Xids that are an application's own. Each kind here is one of those, with where
it shows: the job's output, the scheduler, or a node's kernel log.

Off unless configured (``SimConfig.benign_events``). Rates are events per running job per hour
of *real* time, the clock the loop's windows are measured on (crash confirmation 10 s, the
policy's hang timeout), not simulated hours: training runs ``speedup`` times faster than real
time, and a two-minute evaluation compressed by the same factor would test nothing. For the
same reason pauses last real seconds (``SimConfig.benign_pause_seconds``).

The schedule has a random generator of its own, seeded from the cluster's seed, so it is the
same for the same seed and call times, and a cluster without benign events draws exactly what
it drew before they existed.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

OUTPUT = "output"
SCHEDULER = "scheduler"
KERNEL = "kernel"

# Who sent a command the scheduler received from someone other than the control plane.
ADMINISTRATOR = "administrator"
USER = "user"
BENIGN_CALLERS = frozenset({ADMINISTRATOR, USER})

# How much slower a slow rank gets, and for how long (real seconds): a garbage collection storm,
# a noisy neighbour on the host, a throttled GPU that cools down. Shorter than a straggler window.
SLOW_RANK_FACTOR = (1.3, 2.5)
SLOW_RANK_SECONDS = (20.0, 120.0)
# A data loader stall lasts this share of the longest quiet phase the attempt has shown before:
# the job has been seen to be quiet for longer and came back.
STALL_SHARE_OF_LONGEST = (0.3, 0.8)
# A stall needs an earlier quiet phase at least this long to be shorter than something.
SHORTEST_QUIET_FOR_A_STALL = 5.0
# Real seconds until an administrator resumes a node drained for maintenance.
ADMIN_DRAIN_SECONDS = (60.0, 300.0)


@dataclass(frozen=True)
class BenignKind:
    name: str
    shows_in: str  # OUTPUT, SCHEDULER or KERNEL
    description: str
    # The job goes quiet for a while (no progress lines).
    pause: bool = False


BENIGN_KINDS: tuple[BenignKind, ...] = (
    BenignKind(
        "handled_traceback",
        OUTPUT,
        "a real traceback printed by a handler (logging.exception), then training goes on",
    ),
    BenignKind("warning", OUTPUT, "warnings real healthy jobs printed (UserWarning, DeepSpeed)"),
    BenignKind(
        "nccl_warning",
        OUTPUT,
        "NCCL WARN lines for InfiniBand events the job survives, and NCCL's connect retries",
    ),
    BenignKind("loss_scale_overflow", OUTPUT, "fp16 loss-scale overflow: the step is skipped"),
    BenignKind("eval_pause", OUTPUT, "an evaluation pass, announced, with no progress", True),
    BenignKind(
        "checkpoint_pause", OUTPUT, "a long checkpoint save, from its start line to saved", True
    ),
    BenignKind(
        "dataloader_stall",
        OUTPUT,
        "a quiet gap with no announcement, shorter than one the attempt has shown",
        True,
    ),
    BenignKind(
        "traceback_then_pause",
        OUTPUT,
        "a handled traceback, then at once an evaluation, a checkpoint save or a stall",
        True,
    ),
    BenignKind("slow_rank", OUTPUT, "one node's ranks slow down for a while, then recover"),
    BenignKind("admin_requeue", SCHEDULER, "an administrator's scontrol requeue of the job"),
    BenignKind("preemption", SCHEDULER, "the scheduler preempts the job and requeues it"),
    BenignKind("user_cancel", SCHEDULER, "the job's user cancels it with scancel"),
    BenignKind(
        "admin_drain",
        SCHEDULER,
        "an administrator drains a node under the running job (resumed later)",
    ),
    BenignKind("kernel_nvrm", KERNEL, "benign NVIDIA driver lines: persistence mode, module load"),
    BenignKind("kernel_app_xid", KERNEL, "an Xid that is the application's (13, 31, 43)"),
)
KINDS: dict[str, BenignKind] = {kind.name: kind for kind in BENIGN_KINDS}

# What the soak runs: per running job and real hour. Pauses take about a fifth of a job's time.
SOAK_RATES: tuple[tuple[str, float], ...] = (
    ("handled_traceback", 4.0),
    ("warning", 5.0),
    ("nccl_warning", 4.0),
    ("loss_scale_overflow", 4.0),
    ("eval_pause", 4.0),
    ("checkpoint_pause", 4.0),
    ("dataloader_stall", 4.0),
    ("traceback_then_pause", 4.0),
    ("slow_rank", 2.0),
    ("admin_requeue", 0.4),
    ("preemption", 0.4),
    ("user_cancel", 0.3),
    ("admin_drain", 0.4),
    ("kernel_nvrm", 3.0),
    ("kernel_app_xid", 2.0),
)


class BenignTable:
    """The kinds with a positive rate, drawn in proportion to their rates."""

    def __init__(self, rates: Mapping[str, float] | Sequence[tuple[str, float]] = ()) -> None:
        chosen: dict[str, float] = {}
        for name, rate in dict(rates).items():
            if name not in KINDS:
                raise ValueError(f"unknown benign event {name!r}; known: {', '.join(KINDS)}")
            if rate < 0:
                raise ValueError(f"rate of benign event {name!r} must not be negative")
            if rate > 0:
                chosen[name] = float(rate)
        self.rates = chosen
        self.per_hour = sum(chosen.values())
        self._names = list(chosen)
        self._cumulative: list[float] = []
        running = 0.0
        for name in self._names:
            running += chosen[name]
            self._cumulative.append(running)

    @property
    def enabled(self) -> bool:
        return self.per_hour > 0

    def draw(self, rng: random.Random) -> BenignKind:
        point = rng.random() * self.per_hour
        for name, bound in zip(self._names, self._cumulative, strict=True):
            if point < bound:
                return KINDS[name]
        return KINDS[self._names[-1]]

    def next_in(self, rng: random.Random) -> float:
        """Real seconds until a running job's next benign event."""
        return rng.expovariate(self.per_hour / 3600.0)
