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


# A quiet step's jobs print a progress line every hundred seconds or so and never fail: most
# job polls find nothing new, as on a cluster of long steps, evaluations and checkpoint saves.
QUIET_LOGGED_STEPS_PER_SECOND = 0.01
# A job the simulated scheduler forgot (MinJobAge after it ended) is replaced at a random moment
# within two minutes: the jobs of a step all start at once, and without it every job that ended
# in the first minute was replaced in one poll five minutes later, a second start-up storm.
RESUBMIT_SPREAD_SECONDS = 120.0
# Worker CPU per job poll that finds nothing new, at most (issue target).
TARGET_IDLE_JOB_COST_MS = 0.2


@dataclass(frozen=True)
class Step:
    jobs: int
    nodes: int
    quiet: bool = False

    @property
    def name(self) -> str:
        return f"scale-{self.jobs}j-{self.nodes}n" + ("-quiet" if self.quiet else "")

    @property
    def label(self) -> str:
        return f"{self.jobs}@{self.nodes}" + ("/quiet" if self.quiet else "")

    @classmethod
    def parse(cls, text: str, nodes: int) -> Step:
        """``jobs[@nodes][/quiet]``."""
        size, _, kind = text.strip().partition("/")
        if kind not in ("", "quiet"):
            raise ValueError(f"unknown step kind {kind!r} in {text!r} (only 'quiet')")
        jobs, _, node_text = size.partition("@")
        return cls(int(jobs), int(node_text) if node_text else nodes, kind == "quiet")


@dataclass
class PollTask:
    sent: float
    # "poll" (a cluster's snapshot, sent by the bench in beat's role) or "shard" (a batch of
    # its workloads, queued by the snapshot's task).
    kind: str = "poll"
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
    # Worker processes: one with ``concurrency`` pool processes, or as many single ones.
    worker_processes: int = 1
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
    db_queries: int = 0
    # Opted-in jobs listed, summed over the snapshots done in the window: job polls.
    job_polls: int = 0
    # Workloads processed by shard tasks in the window, and the shard tasks' own figures.
    workloads_processed: int = 0
    # Left alone by the shard tasks as quiet (``recovery.loop.held``).
    workloads_left_quiet: int = 0
    shard_runtimes: list[float] = field(default_factory=list)
    shards_skipped: int = 0
    shards_expired: int = 0
    # Shard tasks the snapshots in the window queued.
    shards_queued: int = 0
    # The cluster-wide checks and decisions (judge_cluster): ran, skipped, expired.
    judges: tuple[int, int, int] = (0, 0, 0)
    cpu: dict[str, float] = field(default_factory=dict)
    machine_busy: float = 0.0
    lines_ingested: int = 0
    # The Console and the API timed during the window (``bench.scaling.console_probe``).
    console: dict[str, object] = field(default_factory=dict)

    @property
    def workers(self) -> int:
        return self.concurrency * self.worker_processes

    @property
    def worker_cpu_s(self) -> float:
        """CPU seconds (user + system, from /proc) of every worker process over the window."""
        return self.cpu.get("worker", 0.0) / 100 * self.window_s

    @property
    def cpu_s_per_1000_lines(self) -> float:
        if not self.lines_ingested:
            return math.nan
        return self.worker_cpu_s / (self.lines_ingested / 1000)

    @property
    def service_cpu_s_per_1000_lines(self) -> float:
        """The same for MariaDB and Redis, which the workers wait on."""
        if not self.lines_ingested:
            return math.nan
        spent = (self.cpu.get("mariadb", 0.0) + self.cpu.get("redis", 0.0)) / 100 * self.window_s
        return spent / (self.lines_ingested / 1000)

    @property
    def queries_per_job_poll(self) -> float:
        return self.db_queries / self.job_polls if self.job_polls else math.nan

    @property
    def detection_median_s(self) -> float:
        return median(self.latencies)

    @property
    def detection_p95_s(self) -> float:
        return percentile(self.latencies, 95)

    @property
    def never_detected(self) -> int:
        return sum(1 for value in self.latencies if math.isinf(value))

    def as_json(self) -> dict[str, object]:
        """The step's figures as ``var/bench/scale.json`` holds them."""

        def number(value: float) -> float | None:
            return None if math.isnan(value) or math.isinf(value) else round(value, 4)

        return {
            "jobs": self.step.jobs,
            "nodes": self.step.nodes,
            "workers": self.workers,
            "worker_processes": self.worker_processes,
            "window_s": number(self.window_s),
            "jobs_running": number(self.jobs_running),
            "lines_written_per_s": number(self.written_lines_s),
            "lines_ingested_per_s": number(self.ingested_lines_s),
            "backlog_lines": self.backlog_lines,
            "detection_median_s": number(self.detection_median_s) if self.latencies else None,
            "detection_p95_s": number(self.detection_p95_s) if self.latencies else None,
            "detection_p95_is_never": bool(self.latencies) and math.isinf(self.detection_p95_s),
            "crashes_measured": len(self.latencies),
            "never_detected": self.never_detected,
            "queries_per_job_poll": number(self.queries_per_job_poll),
            "cpu_s_per_1000_lines": number(self.cpu_s_per_1000_lines),
            "service_cpu_s_per_1000_lines": number(self.service_cpu_s_per_1000_lines),
            "worker_cpu_s": number(self.worker_cpu_s),
            "job_polls_per_worker_cpu_s": number(self.job_polls / self.worker_cpu_s)
            if self.worker_cpu_s
            else None,
            "lines_per_worker_cpu_s": number(self.lines_ingested / self.worker_cpu_s)
            if self.worker_cpu_s
            else None,
            "quiet": self.step.quiet,
            "workloads_processed": self.workloads_processed,
            "workload_reads_per_s": number(self.workloads_processed / self.window_s)
            if self.window_s
            else None,
            "read_interval_s": number(self.read_interval_s),
            "shards_queued_expired": [self.shards_queued, self.shards_expired],
            "workloads_left_quiet": self.workloads_left_quiet,
            "idle_job_cost_ms": number(self.idle_job_cost_ms) if self.step.quiet else None,
            "poll_median_s": number(median(self.poll_runtimes)),
            "shard_median_s": number(median(self.shard_runtimes)),
            "judge_ran_skipped_expired": list(self.judges),
            "cpu_percent": {role: round(value, 1) for role, value in self.cpu.items()},
            "machine_busy_percent": round(self.machine_busy, 1),
            "console": self.console or None,
            "passed": self.passed,
        }

    @property
    def read_interval_s(self) -> float:
        """How long a running job's output waits between two reads, on average: the running
        jobs over the workloads the shard tasks read per second."""
        reads_s = self.workloads_processed / self.window_s if self.window_s else 0.0
        return self.jobs_running / reads_s if reads_s else math.nan

    @property
    def idle_job_cost_ms(self) -> float:
        """Worker CPU per job poll, all of it: on a quiet step, what a job that printed
        nothing new costs (the snapshot's share included)."""
        return self.worker_cpu_s * 1000 / self.job_polls if self.job_polls else math.nan

    @property
    def passed(self) -> bool:
        if self.step.quiet:
            return self.idle_job_cost_ms <= TARGET_IDLE_JOB_COST_MS
        if len(self.latencies) < MIN_SAMPLES or self.never_detected:
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
