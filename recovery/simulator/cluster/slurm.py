"""The simulated cluster as Slurm shows it: job and node listings, scontrol and scancel,
scheduling, and time passing."""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from recovery.schedulers.base import CommandResult, JobInfo, NodeInfo
from recovery.schedulers.optin import parse_job_comment
from recovery.schedulers.slurm_phase import slurm_phase
from recovery.simulator import logtext
from recovery.simulator.cluster.config import (
    FINISHED,
    LOG_INTERVALS,
    MODELS,
    TASKS,
    USERS,
    SimConfig,
)
from recovery.simulator.cluster.records import SimJob, SimNode
from recovery.simulator.cluster.state import epoch_seconds, natural_key, ok_result, to_datetime
from recovery.simulator.cluster.training import TrainingJobs
from recovery.simulator.faults import KINDS


class SimulatedCluster(TrainingJobs):
    """A Slurm-like cluster whose training jobs fail like real ones; see the package docstring."""

    def __init__(
        self, config: SimConfig, state: dict[str, Any] | None = None, *, now: datetime
    ) -> None:
        super().__init__(config, state, now=now)
        if state is None:
            self._keep_jobs_submitted(self.now)
            self._schedule(self.now)
            self._flush()

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

    def _job_info(self, job: SimJob) -> JobInfo:
        path = self.log_path(job.job_id)
        reason = job.hold or job.reason
        return JobInfo(
            job_id=str(job.job_id),
            name=job.name,
            user=job.user,
            partition=job.partition,
            native_state=job.state,
            phase=slurm_phase(job.state),
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
            # The simulated jobs' output is written by this process, as its user.
            user_uid=os.getuid(),
            submit_time=to_datetime(job.submit_time),
            chained_after=(),  # simulated jobs never wait for one another
            eligible_time=to_datetime(job.eligible_time),
            start_time=to_datetime(job.start_time),
            end_time=to_datetime(job.end_time),
        )

    # The commands a scheduler client sends. Each is journaled as received, refused or not;
    # ``caller`` labels who sent it (the simulated adapter passes its user's label).

    def requeue(self, job_id: str, *, hold: bool = False, caller: str = "") -> CommandResult:
        argv = ("scontrol", "requeuehold" if hold else "requeue", str(job_id))
        with self._receiving(argv, job_id, caller):
            job = self._known(job_id, argv)
            if job.state in {"PENDING", "COMPLETING"}:
                self._refuse(argv, f"Job is pending execution for job {job.job_id}")
            if not job.requeue:
                self._refuse(
                    argv, f"Requested operation is presently disabled for job {job.job_id}"
                )
            if job.state == "RUNNING":
                notice = logtext.requeue_notice(
                    job_id=job.job_id, batch_host=job.nodes[0], at=self.now
                )
                self._log(job.job_id, [notice])
            self._requeue(job, self.now, hold=hold)
            self._flush()
        return ok_result(argv)

    def set_excluded_nodes(
        self, job_id: str, nodes: Sequence[str], *, caller: str = ""
    ) -> CommandResult:
        names = sorted(set(nodes), key=natural_key)
        argv = ("scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(names)}")
        with self._receiving(argv, job_id, caller):
            job = self._known(job_id, argv)
            unknown = [name for name in names if name not in self.nodes_by_name]
            if unknown:
                self._refuse(argv, f"Invalid node name specified for job {job.job_id}")
            if job.state not in {"PENDING", "COMPLETING"}:
                self._refuse(argv, f"Job is no longer pending execution for job {job.job_id}")
            job.excluded = names
        return ok_result(argv)

    def release(self, job_id: str, *, caller: str = "") -> CommandResult:
        argv = ("scontrol", "release", str(job_id))
        with self._receiving(argv, job_id, caller):
            job = self._known(job_id, argv)
            if job.state not in {"PENDING", "COMPLETING"}:
                self._refuse(argv, f"Job is no longer pending execution for job {job.job_id}")
            job.hold = ""
        return ok_result(argv)

    def hold(self, job_id: str, *, caller: str = "") -> CommandResult:
        argv = ("scontrol", "hold", str(job_id))
        with self._receiving(argv, job_id, caller):
            job = self._known(job_id, argv)
            if job.state not in {"PENDING", "COMPLETING"}:
                self._refuse(argv, f"Job is no longer pending execution for job {job.job_id}")
            job.hold = "JobHeldAdmin"
        return ok_result(argv)

    def cancel(self, job_id: str, *, caller: str = "") -> CommandResult:
        argv = ("scancel", str(job_id))
        with self._receiving(argv, job_id, caller):
            job = self._find(job_id)
            if job is None:
                # scancel reports an unknown job but still exits 0.
                said = f"Kill job error on job id {job_id}: Invalid job id specified"
                return CommandResult(argv, 0, "", f"scancel: error: {said}\n")
            if job.state in FINISHED:
                return ok_result(argv)
            if job.state == "RUNNING":
                notice = logtext.cancel_notice(
                    job_id=job.job_id, batch_host=job.nodes[0], at=self.now
                )
                self._log(job.job_id, [notice])
                self._end(job, self.now, "CANCELLED", reason="None", signal=15)
            else:
                job.completing_until = None
                self._end(job, self.now, "CANCELLED", reason="None")
            self._flush()
        return ok_result(argv)

    def disable_requeue(self, job_id: str, *, caller: str = "") -> CommandResult:
        argv = ("scontrol", "update", f"JobId={job_id}", "Requeue=0")
        with self._receiving(argv, job_id, caller):
            job = self._known(job_id, argv)
            if job.state in FINISHED:
                self._refuse(argv, f"Job has already finished for job {job.job_id}")
            job.requeue = False
        return ok_result(argv)

    def clear_start_delay(self, job_id: str, *, caller: str = "") -> CommandResult:
        argv = ("scontrol", "update", f"JobId={job_id}", "StartTime=now")
        with self._receiving(argv, job_id, caller):
            job = self._known(job_id, argv)
            if job.state not in {"PENDING", "COMPLETING"}:
                self._refuse(argv, f"Job is no longer pending execution for job {job.job_id}")
            # During COMPLETING the requeue overwrites it when it completes, as in Slurm.
            if job.state == "PENDING":
                job.eligible_time = self.now
        return ok_result(argv)

    def drain(self, name: str, reason: str, *, caller: str = "") -> CommandResult:
        """``scontrol update NodeName=... State=DRAIN Reason=...``: no new job starts there."""
        argv = ("scontrol", "update", f"NodeName={name}", "State=DRAIN", f"Reason={reason}")
        with self._receiving(argv, "", caller):
            node = self._known_node(name, argv)
            node.drain, node.reason = True, reason
        return ok_result(argv)

    def resume(self, name: str, *, caller: str = "") -> CommandResult:
        """``scontrol update NodeName=... State=RESUME``: a drained node takes jobs again."""
        argv = ("scontrol", "update", f"NodeName={name}", "State=RESUME")
        with self._receiving(argv, "", caller):
            node = self._known_node(name, argv)
            if not node.drain and node.state != "DOWN":
                self._refuse(argv, f"Invalid node state transition requested for node {name}")
            node.drain, node.reason = False, ""
            if node.state == "DOWN" and node.defect != "node_death":
                node.state, node.not_responding = "IDLE", False
        return ok_result(argv)

    def _known_node(self, name: str, argv: tuple[str, ...]) -> SimNode:
        node = self.nodes_by_name.get(name)
        if node is None:
            self._refuse(argv, f"Invalid node name specified: {name}")
        assert node is not None
        return node

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

    def advance(self, now: datetime) -> None:
        """Run the cluster up to ``now``; a time not later than the last one changes nothing."""
        until = epoch_seconds(now)
        if until <= self.now:
            return
        self._finish_completing(until)
        self._notice_dead_nodes(until)
        self._repair_due_nodes(until)
        self._resume_admin_drains(until)
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
        spread = self.config.resubmit_spread_seconds
        replacing = self.next_job_id > self.config.first_job_id
        for _ in range(self.config.jobs - active):
            job = self._submit(at)
            if replacing and spread > 0:
                # Users resubmit when they notice, not all in the poll Slurm forgot their jobs.
                job.eligible_time = at + self.rng.uniform(0.0, spread)

    def _submit(self, at: float) -> SimJob:
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
        job = SimJob(
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

    def _start(self, job: SimJob, nodes: list[SimNode], at: float) -> None:
        rng, config = self.rng, self.config
        for node in nodes:
            node.state, node.job = "ALLOCATED", job.job_id
        job.state, job.reason = "RUNNING", "None"
        job.nodes = [node.name for node in nodes]
        job.start_time, job.end_time = at, None
        self._open_attempt(job, at)
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
        job.longest_quiet = 0.0
        job.slow_node, job.slow_factor, job.slow_until = "", 1.0, None
        self._draw_next_benign(job, job.step_at)
