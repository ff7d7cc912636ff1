"""The fault schedule: which fault strikes when, drawn once from the seed before the run starts.

The whole schedule (moments, kinds, targets, delays) is a function of the seed and the run's
length, so a run that found something is replayed with the same faults at the same moments.
What the system does between them is not replayable (it runs on real time and real processes);
the report says which faults actually landed.

Two kinds are armed rather than struck: the next scheduler command of a controller kills its
process right after it took effect, or the next one times out after it took effect. They land
when a controller acts, and only those that landed are counted as injected.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

KILL_WORKER = "kill_worker"
KILL_BEAT = "kill_beat"
KILL_WEB = "kill_web"
KILL_CONTROLLER = "kill_controller"
KILL_CONTROLLER_BETWEEN_COMMANDS = "kill_controller_between_commands"
PAUSE_CONTROLLER = "pause_controller"
RESTART_MARIADB = "restart_mariadb"
RESTART_REDIS = "restart_redis"
SCHEDULER_UNREACHABLE = "scheduler_unreachable"
COMMAND_TIMEOUT = "command_timeout_after_effect"
ARMED = frozenset({KILL_CONTROLLER_BETWEEN_COMMANDS, COMMAND_TIMEOUT})

# Relative weights. Process kills cost a restart (a few CPU seconds for Django and Celery on two
# cores), so the cheaper faults weigh more; a database or broker restart stops everything at
# once, so it is the rarest. Armed faults land only when a controller acts (about one in three
# did in the runs here), so they weigh less than their worth to the schedule.
WEIGHTS: dict[str, float] = {
    KILL_WORKER: 12,
    KILL_BEAT: 6,
    KILL_WEB: 8,
    KILL_CONTROLLER: 14,
    KILL_CONTROLLER_BETWEEN_COMMANDS: 5,
    PAUSE_CONTROLLER: 10,
    RESTART_MARIADB: 4,
    RESTART_REDIS: 4,
    SCHEDULER_UNREACHABLE: 14,
    COMMAND_TIMEOUT: 5,
}


@dataclass(frozen=True)
class Fault:
    at_s: float  # seconds after the schedule starts
    kind: str
    pick: int  # which target among those of its kind (taken modulo their number)
    delay_s: float  # until the restart, the end of the outage, or beyond the lease for a pause
    crash: bool  # a database or broker killed (SIGKILL) rather than shut down

    def describe(self) -> str:
        return f"{self.at_s:8.2f} s {self.kind} pick={self.pick} delay={self.delay_s:.2f}s"


# What the scheduler does, not the control plane: an outage of it, a command of it that times
# out after it took effect. ``--control-plane-only`` leaves these out.
SCHEDULER_FAULTS = (SCHEDULER_UNREACHABLE, COMMAND_TIMEOUT)


def fault_schedule(
    seed: int, faults: int, duration_s: float, without: tuple[str, ...] = ()
) -> list[Fault]:
    """``faults`` faults at uniformly random moments over ``duration_s`` seconds, of every
    kind but those ``without``."""
    rng = random.Random(seed)
    kinds = [kind for kind in WEIGHTS if kind not in without]
    weights = [WEIGHTS[kind] for kind in kinds]
    moments = sorted(rng.uniform(0.0, duration_s) for _ in range(faults))
    schedule = []
    for at in moments:
        kind = rng.choices(kinds, weights)[0]
        if kind in {RESTART_MARIADB, RESTART_REDIS}:
            delay = rng.uniform(0.5, 4.0)
        elif kind == SCHEDULER_UNREACHABLE:
            delay = rng.uniform(2.0, 15.0)
        elif kind == PAUSE_CONTROLLER:
            delay = rng.uniform(1.0, 8.0)
        else:
            delay = rng.uniform(0.2, 5.0)
        schedule.append(Fault(at, kind, rng.randrange(1 << 16), delay, rng.random() < 0.5))
    return schedule
