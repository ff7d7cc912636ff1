"""The pieces the demo stories are made of: names, paths, paces, runs and evidence."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from recovery.choices import AnomalyKind, NodeHealth, Severity
from recovery.detection.findings import Finding
from recovery.models import Attempt

GPUS_PER_NODE = 8


@dataclass
class SeedSummary:
    """How many rows one run of ``seed_demo_cluster`` created (zero everywhere on a re-run)."""

    clusters: int = 0
    nodes: int = 0
    workloads: int = 0
    attempts: int = 0
    anomalies: int = 0
    verdicts: int = 0
    recommendations: int = 0
    events: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @property
    def total(self) -> int:
        return sum(self.as_dict().values())


# --- names and paths ---------------------------------------------------------------------------


def node_names(prefix: str, numbers: Iterable[int]) -> list[str]:
    return [f"{prefix}-{number:03d}" for number in numbers]


def a100(*numbers: int) -> list[str]:
    return node_names("gpu-a100", numbers)


def h100(*numbers: int) -> list[str]:
    return node_names("gpu-h100", numbers)


def hostlist(names: Sequence[str]) -> str:
    """Slurm's compressed form: ``gpu-a100-[001-006,008]``."""
    groups: dict[str, list[str]] = {}
    for name in names:
        prefix, _, number = name.rpartition("-")
        groups.setdefault(prefix, []).append(number)
    parts = []
    for prefix, numbers in groups.items():
        width = len(numbers[0])
        values = sorted(int(n) for n in numbers)
        ranges: list[tuple[int, int]] = []
        first = last = values[0]
        for value in values[1:]:
            if value == last + 1:
                last = value
                continue
            ranges.append((first, last))
            first = last = value
        ranges.append((first, last))
        text = ",".join(
            f"{a:0{width}d}" if a == b else f"{a:0{width}d}-{b:0{width}d}" for a, b in ranges
        )
        parts.append(f"{prefix}-{text}" if len(values) == 1 else f"{prefix}-[{text}]")
    return ",".join(parts)


def slurm_time(at: datetime) -> str:
    return f"{at:%Y-%m-%dT%H:%M:%S}"


def log_time(at: datetime) -> str:
    return f"{at:%Y-%m-%d %H:%M:%S}"


def opt_in(mode: str) -> dict[str, Any]:
    return {
        "opted_in": True,
        "opt_in_settings": {"environment": "prod", "mode": mode},
        "environment": "prod",
        "opt_in_mode": mode,
    }


def megatron_ckpt(base: str) -> Callable[[int], str]:
    return lambda step: f"{base}/iter_{step:07d}"


def deepspeed_ckpt(base: str) -> Callable[[int], str]:
    return lambda step: f"{base}/global_step{step}"


def hf_ckpt(base: str) -> Callable[[int], str]:
    return lambda step: f"{base}/checkpoint-{step}"


# --- what a story is made of -------------------------------------------------------------------


@dataclass(frozen=True)
class Pace:
    """How a training run advances: ``step_seconds`` a step and a checkpoint every ``every``
    steps, written to ``path(step)`` ``save_seconds`` after that step."""

    step_seconds: float
    every: int
    path: Callable[[int], str]
    save_seconds: int = 40


@dataclass(frozen=True)
class Run:
    """One attempt as a story tells it: its row, its nodes, when it started, and the nodes
    kept out of it."""

    attempt: Attempt
    nodes: Sequence[str]
    started_at: datetime
    excluded: Sequence[str] = ()

    @property
    def number(self) -> int:
        return self.attempt.number


@dataclass(frozen=True)
class Progress:
    """How far ``run`` got: its last step, its last checkpoint (and whether it saved one
    itself); with the step it began at and its ``pace``, so that a restart can resume it."""

    run: Run
    pace: Pace
    start_step: int
    step: int
    at: datetime
    checkpoint_step: int | None
    checkpoint_at: datetime | None
    saved: bool


@dataclass(frozen=True)
class NodeSpec:
    state: str = "IDLE"
    reason: str = ""
    health: str = NodeHealth.HEALTHY
    times_implicated: int = 0
    implicated_hours_ago: float | None = None
    excluded_hours: int = 0


@dataclass(frozen=True)
class Evidence:
    """What a detector found in a job's output, a node's kernel log or its metrics."""

    signature: str
    category: str
    attribution: str
    line: str
    excerpt: Sequence[str]
    at: datetime
    kind: str = AnomalyKind.CRASH
    severity: str = Severity.ERROR
    nodes: Sequence[str] = ()
    ranks: Sequence[int] = ()
    occurrences: int = 1
    # "cause", or "symptom" for a consequence (a rank that lost its peer) that waits for one.
    role: str = "cause"
    # "log" (what the job printed: a suspect until the process is seen to end), "scheduler",
    # "metrics"; a node's kernel log is a log read in that node's scope.
    source: str = "log"
    detail: dict[str, Any] = field(default_factory=dict)

    def finding(self) -> Finding:
        return Finding(
            kind=self.kind,
            category=self.category,
            attribution=self.attribution,
            severity=self.severity,
            signature=self.signature,
            evidence=self.line,
            source=self.source,
            count=self.occurrences,
            nodes=list(self.nodes),
            ranks=list(self.ranks),
            at=self.at,
            detail={"role": self.role, "excerpt": "\n".join(self.excerpt), **self.detail},
        )
