"""A simulated Slurm cluster running training jobs that fail the way real ones do.

Only the cluster is simulated: the job lifecycle and the recovery actions behave as Slurm's do
(see ``/work/shared/notes/slurm-lab.md``), and the jobs write log files that the real
detectors read. Time is real time: ``advance(now)`` runs everything that happened between the
previous call and ``now``; training runs ``speedup`` times faster than real time, while the
scheduler's own delays (requeue delay, node timeout, how long finished jobs stay listed) are
real seconds, as they are on a real cluster.

Everything, the random generator included, is kept in a JSON-able state so that a cluster
restored from ``to_state()`` in another process continues exactly as it would have.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from recovery.simulator import logtext
from recovery.simulator.faults import (
    CRASH,
    HANG,
    KINDS,
    NODE_DEATH,
    SCHEDULER,
    STRAGGLER,
    FaultKind,
    FaultTable,
)
from recovery.sources.schedulers.base import CommandResult, JobInfo, NodeInfo, SchedulerError
from recovery.sources.schedulers.optin import parse_job_comment

STATE_VERSION = 1
# A failure's text spans the seconds before the attempt ends (first error to srun's last word).
FAILURE_TEXT_SECONDS = 2.5
GPUS = logtext.GPUS_PER_NODE
FINISHED = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"}
)
# Log intervals a training config would use; the smallest that keeps output readable is chosen.
LOG_INTERVALS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
# Xid codes a node health check drains a node for, and the reason it gives.
DRAINING_XIDS = {
    48: "double bit ECC",
    62: "PMU halt",
    79: "GPU fell off the bus",
    94: "contained ECC",
    95: "uncontained ECC",
    119: "GSP timeout",
    120: "GSP error",
}
MODELS = ("llama3-8b", "llama3-70b", "mixtral-8x7b", "gpt-13b", "nemotron-15b", "qwen2-7b")
TASKS = ("pretrain", "sft", "dpo", "ablation", "long-ctx")
USERS = ("alice", "bhavik", "chen", "dmitri", "ewa", "farah", "gus", "hana")


@dataclass(frozen=True)
class SimConfig:
    """How the simulated cluster looks and behaves.

    Training runs ``speedup`` times faster than real time: step times and fault rates are in
    simulated seconds; scheduler delays are real seconds. Ranges are inclusive.
    """

    name: str
    nodes: int = 64
    jobs: int = 24
    seed: int = 0
    speedup: float = 1.0
    log_dir: str = "var/sim"
    requeue_delay_seconds: float = 6.0
    faults_per_job_hour: float = 2.0
    environment: str = "demo"
    mode: str = "act"
    node_prefix: str = "gpu-"
    partitions: tuple[str, ...] = ("batch",)
    nodes_per_job: tuple[int, int] = (2, 4)
    step_seconds: tuple[float, float] = (0.5, 3.0)
    total_steps: tuple[int, int] = (2_000, 20_000)
    checkpoint_every: tuple[int, int] = (100, 500)
    # Simulated seconds from the start of an attempt to its first step (loading, NCCL init).
    startup_seconds: tuple[float, float] = (20.0, 90.0)
    # Jobs with no opt-in comment, as on a shared cluster where only some users opt in.
    opted_out_fraction: float = 0.0
    # Persistently defective nodes at the start, and how often they fail a job running on them.
    bad_node_fraction: float = 0.03
    bad_node_faults_per_hour: float = 6.0
    # After a node-level fault, the chance the node stays defective (else it was a one-off).
    defect_persistence: float = 0.5
    # The chance that the epilog's health check drains a node after a GPU Xid on it.
    health_check_drain_probability: float = 0.3
    # How much a straggling node slows its job's steps.
    straggler_factor: tuple[float, float] = (1.6, 3.0)
    # Real seconds until Slurm marks a dead node DOWN (SlurmdTimeout=10 gives about 12 s).
    node_failure_detect_seconds: float = 12.0
    # Real seconds a requeued running job spends in COMPLETING.
    completing_seconds: float = 1.0
    # Real seconds finished jobs stay listed (MinJobAge).
    min_job_age_seconds: float = 300.0
    # NCCL's collective timeout, in simulated seconds: how long ranks wait before the
    # watchdog kills a job whose peer stopped (nccl_timeout faults).
    collective_timeout_seconds: float = 600.0
    # Logged steps per real second per job, at most; the log interval follows from it.
    max_logged_steps_per_second: float = 1.0
    # A job that catches up a long gap prints at most this many progress steps per advance.
    max_logged_steps_per_advance: int = 30
    # Per fault kind, a weight replacing its published share (e.g. {"hang": 10}).
    fault_weights: tuple[tuple[str, float], ...] = ()
    first_job_id: int = 1001
    # Real seconds after which an operator has fixed a DOWN or drained node; None: never.
    repair_after_seconds: float | None = None


@dataclass(slots=True)
class _Node:
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
    def from_list(cls, name: str, values: list[Any]) -> _Node:
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
class _Job:
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

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}  # type: ignore[attr-defined]

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> _Job:
        return cls(**values)

    @property
    def stdout_name(self) -> str:
        return f"{self.job_id}.out"


class SimulatedCluster:
    """A Slurm-like cluster whose training jobs fail like real ones; see the module docstring."""

    def __init__(
        self, config: SimConfig, state: dict[str, Any] | None = None, *, now: datetime
    ) -> None:
        self.config = config
        self.table = FaultTable(config.fault_weights)
        self.log_root = Path(config.log_dir).absolute() / config.name
        self._pending_lines: dict[int, list[str]] = {}
        if state is not None:
            self._restore(state)
            return
        self.rng = random.Random(config.seed)
        self.now = _epoch(now)
        self.next_job_id = config.first_job_id
        self.node_list = [_Node(f"{config.node_prefix}{i:04d}") for i in range(1, config.nodes + 1)]
        self.jobs_by_id: dict[int, _Job] = {}
        # [time Slurm notices, node name, job id] for nodes that died under a job.
        self.dying: list[list[Any]] = []
        for node in self.node_list:
            if self.rng.random() < config.bad_node_fraction:
                kind = self.table.draw_node_level(self.rng)
                if kind is not None:
                    self._make_defective(node, kind)
        self._index_nodes()
        self._keep_jobs_submitted(self.now)
        self._schedule(self.now)
        self._flush()

    # ------------------------------------------------------------------ state

    def to_state(self) -> dict[str, Any]:
        # Output still buffered (an injected fault's text) is written before the state is
        # saved: a saved state never has output that was lost.
        self._flush()
        version, internal, gauss = self.rng.getstate()
        return {
            "version": STATE_VERSION,
            "now": self.now,
            "next_job_id": self.next_job_id,
            "rng": [version, list(internal), gauss],
            "nodes": [node.to_list() for node in self.node_list],
            "jobs": [job.to_dict() for job in self.jobs_by_id.values()],
            "dying": self.dying,
        }

    def _restore(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unknown simulator state version {state.get('version')!r}")
        self.rng = random.Random()
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.now = float(state["now"])
        self.next_job_id = int(state["next_job_id"])
        prefix = self.config.node_prefix
        self.node_list = [
            _Node.from_list(f"{prefix}{index:04d}", values)
            for index, values in enumerate(state["nodes"], start=1)
        ]
        self.jobs_by_id = {}
        for values in state["jobs"]:
            job = _Job.from_dict(values)
            self.jobs_by_id[job.job_id] = job
        self.dying = [list(entry) for entry in state["dying"]]
        self._index_nodes()

    def _index_nodes(self) -> None:
        self.nodes_by_name = {node.name: node for node in self.node_list}

    # ------------------------------------------------------------------ reading

    def jobs(self) -> list[JobInfo]:
        return [self._job_info(job) for job in self.jobs_by_id.values()]

    def get_job(self, job_id: str) -> JobInfo | None:
        job = self._find(job_id)
        return None if job is None else self._job_info(job)

    def nodes(self) -> list[NodeInfo]:
        infos = []
        for node in self.node_list:
            flags = []
            if node.drain:
                flags.append("DRAIN")
            if node.not_responding:
                flags.append("NOT_RESPONDING")
            infos.append(
                NodeInfo(name=node.name, state=node.state, flags=flags, reason=node.reason)
            )
        return infos

    def log_path(self, job_id: str | int) -> str:
        return str(self.log_root / f"{job_id}.out")

    def _job_info(self, job: _Job) -> JobInfo:
        path = self.log_path(job.job_id)
        reason = job.hold or job.reason
        return JobInfo(
            job_id=str(job.job_id),
            name=job.name,
            user=job.user,
            partition=job.partition,
            state=job.state,
            reason="" if reason == "None" else reason,
            comment=job.comment,
            opt_in=parse_job_comment(job.comment),
            nodes=list(job.nodes),
            excluded_nodes=list(job.excluded),
            restart_count=job.restart_count,
            exit_code=job.exit_code,
            exit_signal=job.exit_signal,
            requeue_allowed=job.requeue,
            held=bool(job.hold),
            stdout_path=path,
            stderr_path=path,
            work_dir=str(self.log_root),
            submit_time=_datetime(job.submit_time),
            eligible_time=_datetime(job.eligible_time),
            start_time=_datetime(job.start_time),
            end_time=_datetime(job.end_time),
        )

    # ------------------------------------------------------------------ actions

    def requeue(self, job_id: str, *, hold: bool = False) -> CommandResult:
        argv = ("scontrol", "requeuehold" if hold else "requeue", str(job_id))
        job = self._known(job_id, argv)
        if job.state in {"PENDING", "COMPLETING"}:
            self._refuse(argv, f"Job is pending execution for job {job.job_id}")
        if not job.requeue:
            self._refuse(argv, f"Requested operation is presently disabled for job {job.job_id}")
        if job.state == "RUNNING":
            self._log(
                job.job_id,
                [logtext.requeue_notice(job_id=job.job_id, batch_host=job.nodes[0], at=self.now)],
            )
        self._requeue(job, self.now, hold=hold)
        self._flush()
        return _ok(argv)

    def set_excluded_nodes(self, job_id: str, nodes: Sequence[str]) -> CommandResult:
        names = sorted(set(nodes), key=_natural)
        argv = ("scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(names)}")
        job = self._known(job_id, argv)
        unknown = [name for name in names if name not in self.nodes_by_name]
        if unknown:
            self._refuse(argv, f"Invalid node name specified for job {job.job_id}")
        if job.state not in {"PENDING", "COMPLETING"}:
            self._refuse(argv, f"Job is no longer pending execution for job {job.job_id}")
        job.excluded = names
        return _ok(argv)

    def release(self, job_id: str) -> CommandResult:
        argv = ("scontrol", "release", str(job_id))
        job = self._known(job_id, argv)
        if job.state not in {"PENDING", "COMPLETING"}:
            self._refuse(argv, f"Job is no longer pending execution for job {job.job_id}")
        job.hold = ""
        return _ok(argv)

    def hold(self, job_id: str) -> CommandResult:
        argv = ("scontrol", "hold", str(job_id))
        job = self._known(job_id, argv)
        if job.state not in {"PENDING", "COMPLETING"}:
            self._refuse(argv, f"Job is no longer pending execution for job {job.job_id}")
        job.hold = "JobHeldAdmin"
        return _ok(argv)

    def cancel(self, job_id: str) -> CommandResult:
        argv = ("scancel", str(job_id))
        job = self._find(job_id)
        if job is None:
            # scancel reports an unknown job but still exits 0.
            return CommandResult(
                argv,
                0,
                "",
                f"scancel: error: Kill job error on job id {job_id}: Invalid job id specified\n",
            )
        if job.state in FINISHED:
            return _ok(argv)
        if job.state == "RUNNING":
            self._log(
                job.job_id,
                [logtext.cancel_notice(job_id=job.job_id, batch_host=job.nodes[0], at=self.now)],
            )
            self._end(job, self.now, "CANCELLED", reason="None", signal=15)
        else:
            job.completing_until = None
            self._end(job, self.now, "CANCELLED", reason="None")
        self._flush()
        return _ok(argv)

    def disable_requeue(self, job_id: str) -> CommandResult:
        argv = ("scontrol", "update", f"JobId={job_id}", "Requeue=0")
        job = self._known(job_id, argv)
        if job.state in FINISHED:
            self._refuse(argv, f"Job has already finished for job {job.job_id}")
        job.requeue = False
        return _ok(argv)

    def clear_start_delay(self, job_id: str) -> CommandResult:
        argv = ("scontrol", "update", f"JobId={job_id}", "StartTime=now")
        job = self._known(job_id, argv)
        if job.state not in {"PENDING", "COMPLETING"}:
            self._refuse(argv, f"Job is no longer pending execution for job {job.job_id}")
        # During COMPLETING the requeue overwrites it when it completes, as in Slurm.
        if job.state == "PENDING":
            job.eligible_time = self.now
        return _ok(argv)

    def repair_node(self, name: str) -> None:
        """An operator fixed the node: healthy, and back in service."""
        node = self.nodes_by_name[name]
        node.defect, node.slow, node.repair_at = "", 1.0, None
        node.drain, node.not_responding, node.reason = False, False, ""
        if node.state == "DOWN":
            node.state = "IDLE"
        self.dying = [entry for entry in self.dying if entry[1] != name]

    def drain_node(self, name: str, reason: str) -> None:
        """What ``scontrol update NodeName=... State=DRAIN Reason=...`` does."""
        node = self.nodes_by_name[name]
        node.drain, node.reason = True, reason

    def _find(self, job_id: str | int) -> _Job | None:
        text = str(job_id).strip()
        return self.jobs_by_id.get(int(text)) if text.isdigit() else None

    def _known(self, job_id: str, argv: tuple[str, ...]) -> _Job:
        job = self._find(job_id)
        if job is None:
            self._refuse(argv, "Invalid job id specified")
        assert job is not None
        return job

    @staticmethod
    def _refuse(argv: tuple[str, ...], message: str) -> None:
        result = CommandResult(argv, 1, "", f"{message}\n")
        raise SchedulerError(result.describe(), result)

    # ------------------------------------------------------------------ time

    def advance(self, now: datetime) -> None:
        """Run the cluster up to ``now``; a time not later than the last one changes nothing."""
        until = _epoch(now)
        if until <= self.now:
            return
        self._finish_completing(until)
        self._notice_dead_nodes(until)
        self._repair_due_nodes(until)
        for job in sorted(self.jobs_by_id.values(), key=lambda job: job.job_id):
            if job.state == "RUNNING":
                self._run(job, until)
        self.now = until
        self._purge(until)
        self._keep_jobs_submitted(until)
        self._schedule(until)
        self._flush()

    def _finish_completing(self, until: float) -> None:
        for job in self.jobs_by_id.values():
            ending = job.completing_until
            if job.state == "COMPLETING" and ending is not None and ending <= until:
                job.state = "PENDING"
                job.nodes = []
                job.completing_until = None

    def _notice_dead_nodes(self, until: float) -> None:
        remaining = []
        for entry in sorted(self.dying):
            at, name, job_id = entry
            if at > until:
                remaining.append(entry)
                continue
            node = self.nodes_by_name[name]
            node.state, node.not_responding, node.reason = "DOWN", True, "Not responding"
            node.job = 0
            self._out_of_service(node, at)
            job = self.jobs_by_id.get(job_id)
            if job is not None and job.state == "RUNNING" and name in job.nodes:
                context = self._context(job, job.nodes.index(name), at)
                self._log(job.job_id, logtext.failure_lines(KINDS["node_death"], context))
                if job.requeue:
                    self._requeue(job, at, hold=False)
                else:
                    self._end(job, at, "NODE_FAIL", reason="NodeDown")
        self.dying = remaining

    def _repair_due_nodes(self, until: float) -> None:
        if self.config.repair_after_seconds is None:
            return
        for node in self.node_list:
            if node.repair_at is not None and node.repair_at <= until:
                self.repair_node(node.name)

    def _out_of_service(self, node: _Node, at: float) -> None:
        if self.config.repair_after_seconds is not None:
            node.repair_at = at + self.config.repair_after_seconds

    def _purge(self, until: float) -> None:
        age = self.config.min_job_age_seconds
        for job in list(self.jobs_by_id.values()):
            if job.state in FINISHED and job.end_time is not None and until - job.end_time > age:
                del self.jobs_by_id[job.job_id]

    def _keep_jobs_submitted(self, at: float) -> None:
        # A finished job that may still be requeued keeps its slot until Slurm forgets it.
        active = sum(
            1 for job in self.jobs_by_id.values() if job.state not in {"COMPLETED", "CANCELLED"}
        )
        for _ in range(self.config.jobs - active):
            self._submit(at)

    # ------------------------------------------------------------------ jobs

    def _submit(self, at: float) -> _Job:
        config, rng = self.config, self.rng
        job_id = self.next_job_id
        self.next_job_id += 1
        low, high = config.nodes_per_job
        size = max(1, min(rng.randint(low, high), config.nodes))
        step_seconds = round(rng.uniform(*config.step_seconds), 3)
        total = rng.randint(*config.total_steps)
        checkpoint_every = rng.randint(*config.checkpoint_every)
        logged_per_second = config.max_logged_steps_per_second
        steps_per_second = config.speedup / step_seconds
        log_every = next(
            (n for n in LOG_INTERVALS if steps_per_second / n <= logged_per_second),
            LOG_INTERVALS[-1],
        )
        expected = (total * step_seconds + config.startup_seconds[1]) / config.speedup
        comment = ""
        if rng.random() >= config.opted_out_fraction:
            comment = (
                '{"nvidia-recovery":{"environment":"'
                + config.environment
                + '","mode":"'
                + config.mode
                + '"}}'
            )
        job = _Job(
            job_id=job_id,
            name=f"{rng.choice(MODELS)}-{rng.choice(TASKS)}",
            user=rng.choice(USERS),
            partition=rng.choice(config.partitions),
            size=size,
            step_seconds=step_seconds,
            total_steps=total,
            checkpoint_every=checkpoint_every,
            log_every=log_every,
            tokens_per_second=float(rng.choice((4096, 8192)) * rng.uniform(0.9, 1.6)),
            memory_gib=round(rng.uniform(48, 74), 2),
            time_limit=round(max(3 * expected + 600, 1800), 1),
            comment=comment,
            submit_time=at,
            eligible_time=at,
        )
        self.jobs_by_id[job_id] = job
        return job

    def _schedule(self, at: float) -> None:
        """Start pending jobs, oldest first, on idle healthy nodes they do not exclude.

        Priority is the submission order (``priority/basic``), kept across requeues. A job that
        does not fit holds back the nodes it needs from later jobs, like backfill's reservation.
        """
        waiting = [job for job in self.jobs_by_id.values() if job.state == "PENDING"]
        if not waiting:
            return
        waiting.sort(key=lambda job: job.job_id)
        free = [node for node in self.node_list if node.schedulable]
        taken: set[str] = set()
        reserved = 0
        first_untaken = 0
        for job in waiting:
            if job.hold:
                continue
            if job.eligible_time > at:
                job.reason = "BeginTime"
                continue
            available = len(free) - len(taken)
            if available - reserved < job.size:
                job.reason = "Resources" if reserved == 0 else "Priority"
                reserved += job.size
                continue
            excluded = set(job.excluded)
            chosen = []
            while first_untaken < len(free) and free[first_untaken].name in taken:
                first_untaken += 1
            for node in free[first_untaken:]:
                if node.name not in taken and node.name not in excluded:
                    chosen.append(node)
                    if len(chosen) == job.size:
                        break
            if len(chosen) < job.size:
                job.reason = "Resources"
                continue
            taken.update(node.name for node in chosen)
            self._start(job, chosen, at)

    def _start(self, job: _Job, nodes: list[_Node], at: float) -> None:
        rng, config = self.rng, self.config
        for node in nodes:
            node.state, node.job = "ALLOCATED", job.job_id
        job.state, job.reason = "RUNNING", "None"
        job.nodes = [node.name for node in nodes]
        job.start_time, job.end_time = at, None
        job.exit_code = job.exit_signal = None
        job.hung_node, job.hang_tail, job.frozen = "", False, False
        job.frozen_until, job.frozen_kind = None, ""
        job.step = job.checkpoint
        startup = rng.uniform(*config.startup_seconds) / config.speedup
        job.step_at = at + startup
        job.pace = self._pace(job)
        lines = logtext.startup_lines(
            hosts=job.nodes,
            at=at + min(startup, 1.0) * 0.2,
            restart=job.restart_count,
            resume_step=job.checkpoint,
            checkpoint_dir=self._checkpoint_dir(job),
            rng=rng,
        )
        self._log(job.job_id, lines)
        self._draw_next_fault(job, job.step_at)

    def _pace(self, job: _Job) -> float:
        """Real seconds per step until the next logged step: the slowest node sets the pace."""
        slowest = max((self.nodes_by_name[name].slow for name in job.nodes), default=1.0)
        noise = min(max(self.rng.gauss(1.0, 0.03), 0.9), 1.15)
        return job.step_seconds * slowest * noise / self.config.speedup

    def _draw_next_fault(self, job: _Job, after: float) -> None:
        """The next fault of this attempt, from the job's own rate and its defective nodes'."""
        rate = self.config.faults_per_job_hour + sum(
            self.config.bad_node_faults_per_hour
            for name in job.nodes
            if self.nodes_by_name[name].hazardous
        )
        if rate <= 0:
            job.fault_at = None
            return
        simulated = self.rng.expovariate(rate / 3600.0)
        job.fault_at = after + simulated / self.config.speedup

    def _run(self, job: _Job, until: float) -> None:
        """Train from the job's last position up to ``until``, handling what happens on the way."""
        logged = 0
        while job.state == "RUNNING":
            limit = (job.start_time or 0.0) + job.time_limit
            if job.frozen:
                watchdog = job.frozen_until if job.frozen_until is not None else math.inf
                if min(watchdog, limit) > until:
                    break
                if limit <= watchdog:
                    self._time_out(job, limit)
                else:
                    node = job.nodes.index(job.hung_node) if job.hung_node in job.nodes else 0
                    self._crash(job, KINDS[job.frozen_kind], node, watchdog)
                continue
            next_log = (job.step // job.log_every + 1) * job.log_every
            target = min(next_log, job.total_steps)
            if not job.hang_tail:
                next_checkpoint = (job.step // job.checkpoint_every + 1) * job.checkpoint_every
                target = min(target, next_checkpoint)
            bug_step = job.bug[1] if job.bug is not None else None
            if bug_step is not None and bug_step >= job.step and not job.hang_tail:
                if bug_step == job.step:
                    if job.step_at > until:
                        break
                    self._bug(job, job.step_at)
                    continue
                target = min(target, bug_step)
            reached_at = job.step_at + (target - job.step) * job.pace
            fault_at = job.fault_at if job.fault_at is not None else math.inf
            first = min(reached_at, fault_at, limit)
            if first > until:
                break
            if limit <= min(reached_at, fault_at):
                self._time_out(job, limit)
                continue
            if fault_at <= reached_at:
                done = max(int((fault_at - job.step_at) / job.pace), 0)
                job.step += done
                job.step_at += done * job.pace
                job.fault_at = None
                self._fault(job, fault_at)
                continue
            job.step, job.step_at = target, reached_at
            if job.step % job.log_every == 0 or job.step == job.total_steps:
                logged += 1
                if logged <= self.config.max_logged_steps_per_advance:
                    self._log_progress(job, reached_at)
                if job.hang_tail:
                    job.hang_tail, job.frozen = False, True
                    continue
                job.pace = self._pace(job)
            if job.step % job.checkpoint_every == 0 and not job.hang_tail:
                self._log(
                    job.job_id,
                    logtext.checkpoint_lines(
                        host=job.nodes[0],
                        at=reached_at,
                        step=job.step,
                        checkpoint_dir=self._checkpoint_dir(job),
                    ),
                )
                job.checkpoint = job.step
            if job.bug is not None and job.step == job.bug[1]:
                self._bug(job, reached_at)
                continue
            if job.step >= job.total_steps:
                self._log(
                    job.job_id,
                    [logtext.finished_line(host=job.nodes[0], at=reached_at, step=job.step)],
                )
                self._end(job, reached_at, "COMPLETED", reason="None", code=0)

    def _log_progress(self, job: _Job, at: float) -> None:
        rng = self.rng
        loss = logtext.training_loss(job.step, rng)
        lines = []
        for index, name in enumerate(job.nodes):
            if name == job.hung_node:
                continue
            slow = self.nodes_by_name[name].slow
            lines.append(
                logtext.progress_line(
                    rank=index * GPUS,
                    host=name,
                    at=at - rng.uniform(0.0, 0.05),
                    step=job.step,
                    loss=loss,
                    tokens_per_second=job.tokens_per_second / slow * rng.uniform(0.97, 1.03),
                    memory_gib=job.memory_gib,
                )
            )
        self._log(job.job_id, lines)

    # ------------------------------------------------------------------ faults

    def _fault(self, job: _Job, at: float) -> None:
        """A fault strikes the running job: from one of its defective nodes or the job's rate."""
        rng, config = self.rng, self.config
        defective = [i for i, name in enumerate(job.nodes) if self.nodes_by_name[name].hazardous]
        share = len(defective) * config.bad_node_faults_per_hour
        total = share + config.faults_per_job_hour
        if defective and rng.random() * total < share:
            node = rng.choice(defective)
            kind = KINDS[self.nodes_by_name[job.nodes[node]].defect]
        else:
            kind = self.table.draw(rng)
            node = rng.randrange(len(job.nodes))
            if (
                kind.node_level
                and kind.effect != NODE_DEATH
                and rng.random() < (1.0 if kind.effect == STRAGGLER else config.defect_persistence)
            ):
                self._make_defective(self.nodes_by_name[job.nodes[node]], kind)
        self.inject(job, kind, node, at)

    def inject(self, job: _Job | str, kind: FaultKind | str, node: int, at: float) -> None:
        """Make ``kind`` happen to ``job`` on its ``node``-th node at ``at`` (also for tests)."""
        job = job if isinstance(job, _Job) else self._find(job)  # type: ignore[assignment]
        kind = KINDS[kind] if isinstance(kind, str) else kind
        assert isinstance(job, _Job)
        if kind.recurring:
            # The same bug, at the step it was first hit, on every attempt from now on.
            job.bug = [kind.name, job.step, self.rng.getrandbits(32)]
            self._bug(job, at)
        elif kind.effect == CRASH and kind.name == "nccl_timeout":
            self._freeze(job, node, at, crash_kind="nccl_timeout")
        elif kind.effect == CRASH:
            self._crash(job, kind, node, at)
        elif kind.effect == HANG:
            self._freeze(job, node, at, crash_kind="")
        elif kind.effect == STRAGGLER:
            host = self.nodes_by_name[job.nodes[node]]
            if host.slow == 1.0:
                host.slow = round(self.rng.uniform(*self.config.straggler_factor), 2)
            host.defect = kind.name
            self._log(
                job.job_id,
                logtext.thermal_lines(host=host.name, at=at, gpu=self.rng.randrange(GPUS)),
            )
            job.pace = self._pace(job)
            self._draw_next_fault(job, at)
        elif kind.effect == NODE_DEATH:
            job.frozen, job.hung_node = True, job.nodes[node]
            job.fault_at = None
            self.nodes_by_name[job.nodes[node]].defect = "node_death"
            self.dying.append(
                [at + self.config.node_failure_detect_seconds, job.nodes[node], job.job_id]
            )
        elif kind.effect == SCHEDULER:
            self._log(job.job_id, logtext.failure_lines(kind, self._context(job, node, at)))
            if kind.name == "time_limit":
                self._end(job, at, "TIMEOUT", reason="TimeLimit", signal=15)
            elif job.requeue:
                self._requeue(job, at, hold=False)  # PreemptMode=REQUEUE
            else:
                self._end(job, at, "PREEMPTED", reason="None", signal=15)

    def _freeze(self, job: _Job, node: int, at: float, *, crash_kind: str) -> None:
        """A rank stops; the others print one more line and wait in their next collective."""
        job.hung_node = job.nodes[node]
        job.hang_tail = True
        job.fault_at = None
        if crash_kind:
            job.frozen_kind = crash_kind
            job.frozen_until = at + self.config.collective_timeout_seconds / self.config.speedup

    def _bug(self, job: _Job, at: float) -> None:
        assert job.bug is not None
        kind_name, _, seed = job.bug
        kind = KINDS[kind_name]
        text_rng = random.Random(seed)
        node = text_rng.randrange(len(job.nodes))
        context = self._context(job, node, at - FAILURE_TEXT_SECONDS, rng=text_rng)
        self._log(job.job_id, logtext.failure_lines(kind, context))
        self._end(job, at, "FAILED", reason="NonZeroExitCode", code=1)

    def _crash(self, job: _Job, kind: FaultKind, node: int, at: float) -> None:
        xid = self.rng.choice(kind.xids) if kind.xids else None
        context = self._context(job, node, at - FAILURE_TEXT_SECONDS, xid=xid)
        self._log(job.job_id, logtext.failure_lines(kind, context))
        host = self.nodes_by_name[job.nodes[node]]
        if kind.name == "host_oom":
            self._end(job, at, "OUT_OF_MEMORY", reason="OutOfMemory", signal=125)
        elif kind.name == "segfault":
            self._end(job, at, "FAILED", reason="NonZeroExitCode", code=139)
        else:
            self._end(job, at, "FAILED", reason="NonZeroExitCode", code=1)
        if xid in DRAINING_XIDS and self.rng.random() < self.config.health_check_drain_probability:
            host.drain = True
            host.reason = f"Xid {xid}: {DRAINING_XIDS[xid]}"
            self._out_of_service(host, at)

    def _time_out(self, job: _Job, at: float) -> None:
        context = self._context(job, 0, at)
        self._log(job.job_id, logtext.failure_lines(KINDS["time_limit"], context))
        self._end(job, at, "TIMEOUT", reason="TimeLimit", signal=15)

    def _make_defective(self, node: _Node, kind: FaultKind) -> None:
        node.defect = kind.name
        if kind.effect == STRAGGLER:
            node.slow = round(self.rng.uniform(*self.config.straggler_factor), 2)

    def _context(
        self,
        job: _Job,
        node: int,
        at: float,
        *,
        rng: random.Random | None = None,
        xid: int | None = None,
    ) -> logtext.FailureContext:
        return logtext.FailureContext(
            job_id=job.job_id,
            hosts=list(job.nodes),
            node=node,
            step=job.step,
            at=at,
            rng=rng or self.rng,
            checkpoint_dir=self._checkpoint_dir(job),
            xid=xid,
        )

    def _checkpoint_dir(self, job: _Job) -> str:
        return f"/checkpoints/{job.name}/{job.job_id}"

    # ------------------------------------------------------------------ endings

    def _release_nodes(self, job: _Job) -> None:
        for name in job.nodes:
            node = self.nodes_by_name[name]
            if node.job == job.job_id:
                node.job = 0
                if node.state == "ALLOCATED":
                    node.state = "IDLE"

    def _end(
        self,
        job: _Job,
        at: float,
        state: str,
        *,
        reason: str,
        code: int | None = None,
        signal: int | None = None,
    ) -> None:
        self._release_nodes(job)
        job.state, job.reason = state, reason
        job.end_time = at
        job.exit_code, job.exit_signal = (
            code if code is not None else (None if signal else 0),
            signal,
        )
        job.fault_at = None
        job.hold = ""

    def _requeue(self, job: _Job, at: float, *, hold: bool) -> None:
        """Slurm's requeue: COMPLETING for a moment, then PENDING with the requeue delay."""
        was_running = job.state == "RUNNING"
        self._release_nodes(job)
        job.restart_count += 1
        job.submit_time = at
        job.eligible_time = at + self.config.requeue_delay_seconds
        job.end_time = at
        job.exit_code = job.exit_signal = None
        job.fault_at = None
        job.frozen, job.hang_tail, job.hung_node = False, False, ""
        job.frozen_until, job.frozen_kind = None, ""
        job.hold = "job_requeued_in_held_state" if hold else ""
        job.reason = "BeginTime"
        if was_running:
            job.state = "COMPLETING"
            job.completing_until = at + self.config.completing_seconds
        else:
            job.state = "PENDING"
            job.nodes = []

    # ------------------------------------------------------------------ output

    def _log(self, job_id: int, lines: list[str]) -> None:
        if lines:
            self._pending_lines.setdefault(job_id, []).extend(lines)

    def _flush(self) -> None:
        if not self._pending_lines:
            return
        self.log_root.mkdir(parents=True, exist_ok=True)
        for job_id, lines in self._pending_lines.items():
            with (self.log_root / f"{job_id}.out").open("a", encoding="utf-8") as handle:
                handle.write("\n".join(lines) + "\n")
        self._pending_lines = {}


def _ok(argv: tuple[str, ...]) -> CommandResult:
    return CommandResult(argv, 0, "", "")


def _epoch(moment: datetime) -> float:
    if moment.tzinfo is None:
        raise ValueError("the simulator needs aware datetimes (UTC)")
    return moment.timestamp()


def _datetime(epoch: float | None) -> datetime | None:
    return None if not epoch else datetime.fromtimestamp(epoch, tz=UTC)


def _natural(name: str) -> tuple[str, int]:
    digits = "".join(char for char in name if char.isdigit())
    return name.rstrip("0123456789"), int(digits or 0)
