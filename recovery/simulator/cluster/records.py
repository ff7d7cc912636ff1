"""The records a simulated cluster keeps per node and per job, in its JSON-able state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from recovery.simulator.faults import KINDS, STRAGGLER


@dataclass(slots=True)
class SimNode:
    name: str
    state: str = "IDLE"  # IDLE, ALLOCATED or DOWN
    drain: bool = False
    not_responding: bool = False
    reason: str = ""
    job: int = 0
    defect: str = ""  # the fault kind this node keeps causing
    slow: float = 1.0  # step-time factor of its ranks
    repair_at: float | None = None

    def to_list(self) -> list[Any]:
        return [
            self.state,
            self.drain,
            self.not_responding,
            self.reason,
            self.job,
            self.defect,
            self.slow,
            self.repair_at,
        ]

    @classmethod
    def from_list(cls, name: str, values: list[Any]) -> SimNode:
        return cls(name, *values)

    @property
    def schedulable(self) -> bool:
        # A node that died is not yet known to Slurm as DOWN, but nothing can start on it.
        return self.state == "IDLE" and not self.drain and self.defect != "node_death"

    @property
    def hazardous(self) -> bool:
        """Its defect keeps failing jobs (a slow node only slows them)."""
        return bool(self.defect) and KINDS[self.defect].effect != STRAGGLER


@dataclass(slots=True)
class SimJob:
    job_id: int
    name: str
    user: str
    partition: str
    size: int
    step_seconds: float
    total_steps: int
    checkpoint_every: int
    log_every: int
    tokens_per_second: float
    memory_gib: float
    time_limit: float
    comment: str
    submit_time: float
    state: str = "PENDING"
    reason: str = "Priority"
    hold: str = ""  # "", "JobHeldAdmin" or "job_requeued_in_held_state"
    requeue: bool = True
    restart_count: int = 0
    nodes: list[str] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)
    exit_code: int | None = None
    exit_signal: int | None = None
    eligible_time: float = 0.0
    start_time: float | None = None
    end_time: float | None = None
    completing_until: float | None = None
    # Training position: the last completed step and when it completed.
    step: int = 0
    step_at: float = 0.0
    pace: float = 1.0  # real seconds per step until the next logged step
    checkpoint: int = 0
    fault_at: float | None = None
    # [kind, step, text seed]: an application bug that fails every attempt at that step.
    bug: list[Any] | None = None
    hung_node: str = ""
    hang_tail: bool = False  # the other ranks still print one more progress line
    frozen: bool = False
    frozen_until: float | None = None  # when a frozen job's watchdog ends it
    frozen_kind: str = ""
    # Benign events (recovery.simulator.benign), on a cluster that has them; per attempt.
    benign_at: float | None = None  # when the next one happens
    # [[at, lines, checkpoint step or -1]]: output a pause writes when it ends.
    benign_due: list[list[Any]] = field(default_factory=list)
    paused_until: float | None = None  # the end of the pause under way
    longest_quiet: float = 0.0  # real seconds of the longest pause taken so far
    slow_node: str = ""  # a node whose ranks are slow for a while
    slow_factor: float = 1.0
    slow_until: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SimJob:
        return cls(**values)

    @property
    def stdout_name(self) -> str:
        return f"{self.job_id}.out"
