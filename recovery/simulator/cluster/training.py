"""Training jobs at work: steps, progress lines, checkpoints, and the faults that end them."""

from __future__ import annotations

import math
import random

from recovery.simulator import logtext
from recovery.simulator.cluster.benign import BenignEvents
from recovery.simulator.cluster.config import DRAINING_XIDS, FAILURE_TEXT_SECONDS, GPUS
from recovery.simulator.cluster.records import SimJob
from recovery.simulator.faults import (
    CRASH,
    HANG,
    KINDS,
    NODE_DEATH,
    SCHEDULER,
    STRAGGLER,
    FaultKind,
)


class TrainingJobs(BenignEvents):
    """Runs the cluster's training jobs and makes faults happen to them."""

    def _run(self, job: SimJob, until: float) -> None:
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
            benign_at = self._next_benign_moment(job)
            if benign_at is not None and benign_at < first and not job.hang_tail:
                if benign_at > until:
                    break
                # Steps done by then; none reaches a logged step or a checkpoint, which
                # come later.
                done = max(int((benign_at - job.step_at) / job.pace), 0)
                job.step += done
                job.step_at += done * job.pace
                self._benign_step(job, benign_at)
                continue
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
                self._recover_slow_rank(job, reached_at)
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

    def _log_progress(self, job: SimJob, at: float) -> None:
        rng = self.rng
        loss = logtext.training_loss(job.step, rng)
        lines = []
        for index, name in enumerate(job.nodes):
            if name == job.hung_node:
                continue
            slow = self.nodes_by_name[name].slow * self._benign_slowness(job, name)
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

    def _fault(self, job: SimJob, at: float) -> None:
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

    def inject(self, job: SimJob | str, kind: FaultKind | str, node: int, at: float) -> None:
        """Make ``kind`` happen to ``job`` on its ``node``-th node at ``at`` (also for tests)."""
        job = job if isinstance(job, SimJob) else self._find(job)  # type: ignore[assignment]
        kind = KINDS[kind] if isinstance(kind, str) else kind
        assert isinstance(job, SimJob)
        if kind.recurring:
            # The same bug, at the step it was first hit, on every attempt from now on (each
            # journaled where it fails the attempt).
            job.bug = [kind.name, job.step, self.rng.getrandbits(32)]
            self._bug(job, at)
            return
        # Journaled when it strikes, also where its effect comes later (a hang, a dead node).
        shown_on = job.nodes[node]
        self._record_failure(job, kind, at, node=shown_on if kind.node_level else "", host=shown_on)
        if kind.effect == CRASH and kind.name == "nccl_timeout":
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
            self._stop_benign(job)
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

    def _freeze(self, job: SimJob, node: int, at: float, *, crash_kind: str) -> None:
        """A rank stops; the others print one more line and wait in their next collective."""
        job.hung_node = job.nodes[node]
        job.hang_tail = True
        job.fault_at = None
        self._stop_benign(job)
        if crash_kind:
            job.frozen_kind = crash_kind
            job.frozen_until = at + self.config.collective_timeout_seconds / self.config.speedup

    def _bug(self, job: SimJob, at: float) -> None:
        assert job.bug is not None
        kind_name, _, seed = job.bug
        kind = KINDS[kind_name]
        text_rng = random.Random(seed)
        node = text_rng.randrange(len(job.nodes))
        self._record_failure(job, kind, at, node="", host=job.nodes[node])
        context = self._context(job, node, at - FAILURE_TEXT_SECONDS, rng=text_rng)
        self._log(job.job_id, logtext.failure_lines(kind, context))
        self._end(job, at, "FAILED", reason="NonZeroExitCode", code=1)

    def _crash(self, job: SimJob, kind: FaultKind, node: int, at: float) -> None:
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

    def _time_out(self, job: SimJob, at: float) -> None:
        self._record_failure(job, KINDS["time_limit"], at, node="", host="")
        context = self._context(job, 0, at)
        self._log(job.job_id, logtext.failure_lines(KINDS["time_limit"], context))
        self._end(job, at, "TIMEOUT", reason="TimeLimit", signal=15)
