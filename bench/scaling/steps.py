"""A load step (jobs on a cluster of nodes), the poll tasks sent during it and its figures."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "var" / "bench-scale"
TARGET_MEDIAN_S = 5.0
TARGET_P95_S = 15.0
MIN_SAMPLES = 5


@dataclass(frozen=True)
class Step:
    jobs: int
    nodes: int

    @property
    def name(self) -> str:
        return f"scale-{self.jobs}j-{self.nodes}n"

    @classmethod
    def parse(cls, text: str, nodes: int) -> Step:
        jobs, _, node_text = text.strip().partition("@")
        return cls(int(jobs), int(node_text) if node_text else nodes)


@dataclass
class PollTask:
    sent: float
    started: float | None = None
    finished: float | None = None
    runtime: float | None = None
    result: dict[str, int] = field(default_factory=dict)
    expired: bool = False
    failed: bool = False


@dataclass
class StepResult:
    step: Step
    concurrency: int
    window_s: float = 0.0
    jobs_running: float = 0.0
    written_lines_s: float = 0.0
    ingested_lines_s: float = 0.0
    ingested_mb_s: float = 0.0
    backlog_lines: int = 0
    poll_runtimes: list[float] = field(default_factory=list)
    polls_sent: int = 0
    polls_done: int = 0
    polls_skipped: int = 0
    polls_expired: int = 0
    polls_failed: int = 0
    queue_lags: list[float] = field(default_factory=list)
    queue_lengths: list[int] = field(default_factory=list)
    sim_lags: list[float] = field(default_factory=list)
    state_kb: float = 0.0
    # Detected crashes' latencies; a crash still unread after the drain counts as infinite.
    latencies: list[float] = field(default_factory=list)
    missed: int = 0
    # How much earlier Anomaly.detected_at is than the moment the detection was recorded.
    stamp_early: list[float] = field(default_factory=list)
    unread_lines: int = 0
    anomalies: dict[str, int] = field(default_factory=dict)
    undetected_note: str = ""
    db_queries_s: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    machine_busy: float = 0.0

    @property
    def passed(self) -> bool:
        if len(self.latencies) < MIN_SAMPLES:
            return False
        return (
            statistics.median(self.latencies) < TARGET_MEDIAN_S
            and percentile(self.latencies, 95) < TARGET_P95_S
        )


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: with a few dozen samples, a value that was actually seen."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def seconds(value: float) -> str:
    return "never" if math.isinf(value) else f"{value:.1f}"


def median(values: list[float] | list[int]) -> float:
    return float(statistics.median(values)) if values else float("nan")
