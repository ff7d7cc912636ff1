"""The harness of the end-to-end scenarios: jobs, faults, the loop under test, the figures.

The loop runs as it does in production, in the test process: a thread polls the cluster every
second (``poll_cluster``, and the watchdog), and the Advisor Controller claims and carries out
recommendations through the Advisor API of pytest-django's live server. Each scenario gets its
own Cluster row (its mode, its policies, its kernel-log folder) on the shared Slurm cluster of
its version, reached as the project reaches it (local commands for 22.05, SSH for 24.11);
jobs of other scenarios and tests, still in Slurm's memory, fall under a record-only default
policy so nothing acts on them.

The parts, by topic: ``job`` (the training job and its files), ``procs`` (its processes, for
faults), ``slurm_view`` (Slurm read directly, and the timeline), ``loop`` (the poller and
controller threads) and ``figures`` (the report row's figures and the report).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from django.utils import timezone

from recovery.choices import AuditKind, ClusterMode, WorkloadState
from recovery.controller.client import AdvisorClient
from recovery.controller.controller import AdvisorController
from recovery.loop.poll import adapter_for
from recovery.loop.replay import SAME, replay
from recovery.models import (
    Anomaly,
    AuditEvent,
    Cluster,
    ControllerToken,
    EnvironmentBinding,
    Policy,
    Workload,
)
from tests.e2e.figures import Report, scenario_figures
from tests.e2e.job import (
    CKPT_EVERY,
    JOB_SCRIPT,
    NODES_PER_JOB,
    PROGRAM,
    STEP_SECONDS,
    E2EJob,
    Injection,
)
from tests.e2e.loop import Loop
from tests.e2e.procs import Proc, all_procs, job_procs, read_proc
from tests.e2e.slurm_view import Timeline, node_states, slurm
from tests.slurm_fixtures import SlurmCluster

# Slurm's job states after which the job does not run again unless someone requeues it.
FINAL_JOB_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL"}
)
FINAL_WORKLOAD_STATES = frozenset(
    {WorkloadState.COMPLETED, WorkloadState.FAILED, WorkloadState.CANCELLED, WorkloadState.STOPPED}
)

T = TypeVar("T")


class Harness:
    """One scenario: its cluster row, policy, loop, job, fault, figures and report row."""

    def __init__(
        self,
        name: str,
        *,
        live_server_url: str,
        slurm_cluster: SlurmCluster,
        workdir: Path,
        report: Report,
    ) -> None:
        self.name = name
        self.environment = f"e2e-{name}"
        self.live_server_url = live_server_url
        self.slurm = slurm_cluster
        self.workdir = workdir
        self.report = report
        self.kernel_dir = workdir / "kernel"
        self.cluster: Cluster | None = None
        self.token = ""
        self.loop: Loop | None = None
        self.jobs: list[E2EJob] = []
        self.timeline: Timeline | None = None
        self.timelines: list[Timeline] = []
        self.injection: Injection | None = None
        self.started = time.time()
        self.row: dict[str, Any] = {
            "scenario": name,
            "slurm": slurm_cluster.version,
            "passed": False,
        }
        # The kind of anomaly the scenario is about; its first one times the detection.
        self.anomaly_kind: str | None = None

    # ------------------------------------------------------------------ set-up

    def setup(
        self,
        name: str,
        *,
        mode: str = ClusterMode.ACTION,
        controller: bool = True,
        **policy: Any,
    ) -> Cluster:
        """Name the scenario, create its cluster row and policies, and start the loop."""
        self.name = name
        self.environment = f"e2e-{name.split('-')[0]}"
        self.row["scenario"] = name
        for node in self.slurm.nodes:
            (self.kernel_dir / node).mkdir(parents=True, exist_ok=True)
            (self.kernel_dir / node / "kern.log").touch()
        connection, settings = self.slurm.connection()
        cluster = Cluster.objects.create(
            name=f"lab-{self.name}",
            connection=connection,
            connection_settings={
                **settings,
                "node_kernel_log": str(self.kernel_dir / "{node}" / "kern.log"),
            },
            mode=mode,
            acknowledge_scheduler_actions=mode == ClusterMode.ACTION,
        )
        # Earlier scenarios' and tests' jobs are still in Slurm's memory and get polled too.
        Policy.objects.create(name=f"{self.name} record only", cluster=cluster, crash_action="none")
        Policy.objects.create(
            name=self.name,
            cluster=cluster,
            environment=self.environment,
            blast_radius_percent=100,
            **policy,
        )
        # The operator lets the scenario's jobs choose its policy for nodes and other jobs too.
        EnvironmentBinding.objects.create(
            cluster=cluster, environment=self.environment, any_job=True
        )
        _, self.token = ControllerToken.issue(cluster, f"{self.name}-advisor")
        advisor = None
        if controller:
            advisor = AdvisorController(
                AdvisorClient(self.live_server_url, self.token),
                adapter_for(cluster),
                poll_seconds=0.2,
            )
        self.cluster = cluster
        self.loop = Loop(cluster, advisor)
        self.loop.start()
        return cluster

    def submit(
        self,
        *,
        total_steps: int = 2000,
        mode: str = "act",
        workflow: str | None = None,
        after: str | None = None,
        nodes: int = NODES_PER_JOB,
        partition: str | None = None,
        **env: str,
    ) -> E2EJob:
        """Submit the training job on ``nodes`` nodes, to ``partition`` (Slurm's default
        partition unless named); ``env`` adds to the job's environment."""
        tag = uuid.uuid4().hex[:6]
        workdir = self.workdir / f"job-{tag}"
        ckpt_dir = workdir / "checkpoints"
        ckpt_dir.mkdir(parents=True)
        control = workdir / "faults.json"
        control.write_text("{}")
        output = workdir / "train.log"
        comment = {"nvidia-recovery": {"environment": self.environment, "mode": mode}}
        if workflow is not None:
            comment["nvidia-recovery"]["workflow"] = workflow
        # On 24.11 the job runs in the chroot, where this interpreter and its venv are mounted
        # at the same paths.
        job_env = {
            "PYTHON": sys.executable,
            "TRAIN_PROGRAM": str(PROGRAM),
            "CKPT_DIR": str(ckpt_dir),
            "CONTROL_FILE": str(control),
            "TOTAL_STEPS": str(total_steps),
            "STEP_SECONDS": str(STEP_SECONDS),
            "CKPT_EVERY": str(CKPT_EVERY),
            **env,
        }
        submitted = slurm(
            self.slurm,
            "sbatch",
            "--parsable",
            f"--job-name=e2e-{self.name}",
            f"--output={output}",
            f"--chdir={workdir}",
            f"--nodes={nodes}",
            *([f"--partition={partition}"] if partition else []),
            f"--comment={json.dumps(comment)}",
            *([f"--dependency={after}"] if after else []),
            str(JOB_SCRIPT),
            env=job_env,
        )
        assert submitted.returncode == 0, submitted.stderr
        job = E2EJob(
            submitted.stdout.strip().split(";")[0], workdir, output, ckpt_dir, control, self.slurm
        )
        self.jobs.append(job)
        self.row["job_id"] = job.job_id
        # The report shows the last job's timeline; every job's is stopped in ``close``.
        self.timeline = Timeline(self.slurm, job.job_id, self.started)
        self.timeline.start()
        self.timelines.append(self.timeline)
        return job

    # ------------------------------------------------------------------ waiting

    def wait_for(
        self, what: str, check: Callable[[], T | None], timeout: float, every: float = 0.25
    ) -> T:
        deadline = time.monotonic() + timeout
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: timed out after {timeout:.0f} s: {what}")
            self.fail_on_loop_errors()
            time.sleep(every)

    def fail_on_loop_errors(self) -> None:
        if self.loop is not None and self.loop.errors:
            raise AssertionError(f"the loop raised:\n{self.loop.errors[0]}")

    def workload(self, job: E2EJob) -> Workload | None:
        return (
            Workload.objects.filter(cluster=self.cluster, job_id=job.job_id)
            .order_by("-submit_time")
            .first()
        )

    def wait_until_training(self, job: E2EJob, checkpoint_step: int = CKPT_EVERY) -> Workload:
        """Until the loop has seen the job train and save a checkpoint."""

        def trained() -> Workload | None:
            workload = self.workload(job)
            if workload is None or (workload.last_checkpoint_step or 0) < checkpoint_step:
                return None
            return workload

        workload = self.wait_for(f"job {job.job_id} checkpointed (log: {job.output})", trained, 90)
        # A scenario starts from a healthy first attempt, or its figures would mean nothing.
        seen = list(
            Anomaly.objects.filter(workload=workload).values_list("signature", "evidence_line")
        )
        assert workload.current_attempt == 1 and not seen, (
            f"job {job.job_id} was not healthy before the fault: attempt "
            f"{workload.current_attempt}, anomalies {seen}\n{job.log()[-3000:]}"
        )
        return workload

    def wait_for_restart(self, job: E2EJob, timeout: float = 120) -> dict[str, str]:
        """Until Slurm runs the job again, and the new attempt saved a checkpoint the loop saw."""
        assert self.injection is not None
        attempt = self.injection.attempt

        def restarted() -> dict[str, str] | None:
            fields = job.slurm_state()
            if int(fields.get("Restarts", "0") or 0) < attempt:
                return None
            if not AuditEvent.objects.filter(
                workload__cluster=self.cluster,
                workload__job_id=job.job_id,
                kind=AuditKind.CHECKPOINT_SAVED,
                attempt__gt=attempt,
            ).exists():
                return None
            return fields

        return self.wait_for(f"job {job.job_id} restarted and checkpointed", restarted, timeout)

    def wait_until_finished(
        self,
        job: E2EJob,
        timeout: float = 180,
        *,
        unless: Callable[[], str | None] | None = None,
    ) -> dict[str, str]:
        """Until Slurm shows the job ended for good and the loop has seen it end.

        ``unless`` may name a reason to stop waiting early (a scheduler action on a job that was
        meant to be left alone): the wait then fails at once with it.
        """

        def finished() -> dict[str, str] | None:
            if unless is not None:
                reason = unless()
                if reason:
                    raise AssertionError(f"{self.name}: {reason}")
            fields = job.slurm_state()
            if fields.get("JobState") not in FINAL_JOB_STATES:
                return None
            workload = self.workload(job)
            if workload is None or workload.state not in FINAL_WORKLOAD_STATES:
                return None
            return fields

        return self.wait_for(f"job {job.job_id} finished (log: {job.output})", finished, timeout)

    # ------------------------------------------------------------------ faults

    def inject(self, job: E2EJob, what: str, **detail: Any) -> Injection:
        workload = self.workload(job)
        attempt = workload.current_attempt if workload else 1
        self.injection = Injection(timezone.now(), attempt, {"fault": what, **detail})
        if self.timeline is not None:
            self.timeline.note(f"injected: {what} {detail}")
        return self.injection

    def kill_rank(self, job: E2EJob, rank: int, sig: int = signal.SIGKILL) -> Injection:
        proc = job.ranks()[rank]
        injection = self.inject(
            job,
            f"signal {signal.Signals(sig).name} to rank {rank}",
            node=proc.env.get("SLURMD_NODENAME"),
            pid=proc.pid,
        )
        os.kill(proc.pid, sig)
        return injection

    def kill_node(self, job: E2EJob, node: str) -> Injection:
        """The node dies: its slurmd and every process of the job on it, all at once."""
        # The chroot's processes (24.11) are processes of this host too.
        slurmd = self.slurm.pid_of(f"slurmd.{node}") or 0
        assert (read_proc(slurmd) or Proc(0, 0, "", "", {})).comm == "slurmd", (
            f"the pid file of {node} does not name a running slurmd"
        )
        procs = {p.pid: p for p in all_procs()}
        on_node = [
            p
            for p in procs.values()
            if p.env.get("SLURM_JOB_ID") == job.job_id and p.env.get("SLURMD_NODENAME") == node
        ]
        # The step daemons have no job environment; they are the parents of the job's tasks.
        stepds = {p.ppid for p in on_node if p.ppid in procs and procs[p.ppid].comm == "slurmstepd"}
        targets = [slurmd, *stepds, *(p.pid for p in on_node)]
        injection = self.inject(
            job,
            f"node {node} dies",
            node=node,
            killed={"slurmd": slurmd, "slurmstepd": sorted(stepds), "tasks": len(on_node)},
        )
        for pid in targets:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return injection

    def revive_node(self, node: str) -> None:
        """Start the node's slurmd again and wait until all four nodes take jobs."""
        repaired = self.slurm.up()
        states = node_states(self.slurm)
        if states.get(node, "").startswith(("down", "drain", "fail")):
            slurm(self.slurm, "scontrol", "update", f"NodeName={node}", "State=RESUME")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            states = node_states(self.slurm)
            if all(
                s.rstrip("*") in {"idle", "mixed", "allocated"} and not s.endswith("*")
                for s in states.values()
            ):
                return
            time.sleep(0.5)
        raise AssertionError(f"node {node} did not come back: {states}\n{repaired.stderr}")

    def xid(self, node: str, code: int = 79) -> str:
        """Append an Xid line to the node's kernel log, as the NVIDIA driver would."""
        now = datetime.now()
        uptime = time.monotonic()
        line = (
            f"{now:%b} {now.day:2d} {now:%H:%M:%S} {node} kernel: [{uptime:12.6f}] "
            f"NVRM: Xid (PCI:0000:3b:00): {code}, pid=31337, GPU has fallen off the bus.\n"
        )
        with (self.kernel_dir / node / "kern.log").open("a") as log:
            log.write(line)
        return line.strip()

    # ------------------------------------------------------------------ figures

    def figures(self, job: E2EJob, *, anomaly_kind: str | None = None) -> dict[str, Any]:
        """The report row's figures of ``job``: see ``scenario_figures``."""
        return scenario_figures(self.workload(job), self.injection, anomaly_kind=anomaly_kind)

    def record(self, **extra: Any) -> None:
        self.row.update(extra)

    def finish(self, failure: str | None) -> None:
        """Complete the report row; called after the test, before the database is flushed."""
        try:
            if self.jobs:
                self.row.update(self.figures(self.jobs[0], anomaly_kind=self.anomaly_kind))
        except Exception:
            self.row.setdefault("figures_error", traceback.format_exc()[-2000:])
        if failure is None and self.cluster is not None:
            self.row["replay"] = self.replay_of_the_run()
        self.row["passed"] = failure is None
        if failure is not None:
            self.row["failure"] = failure[-3000:]
        self.row["duration_s"] = round(time.time() - self.started, 1)
        if self.loop is not None:
            self.row["loop"] = {
                "polls": self.loop.polls,
                "watchdog": self.loop.watchdog is not None,
                "errors": [e[-1500:] for e in self.loop.errors[:3]],
                "controller_outcomes": [
                    [round(t - self.started, 2), i, o] for t, i, o in self.loop.outcomes
                ],
            }
        if self.timeline is not None:
            self.row["timeline"] = self.timeline.entries[:200]
        self.report.rows.append(self.row)

    def replay_of_the_run(self) -> dict[str, Any]:
        """The policies in force replayed over what the run decided: the same decisions.

        Recorded in the report; ``differences`` lists any decision the replay did not
        reproduce (the scenario fixture fails the test on them).
        """
        assert self.cluster is not None
        since = datetime.fromtimestamp(self.started - 60, tz=UTC)
        report = replay(self.cluster, since, timezone.now() + timedelta(seconds=1))
        return {
            "decisions": len(report.decisions),
            "verdicts": dict(report.verdicts),
            "differences": [
                f"{d.job_id}/{d.attempt} {d.kind}: recorded "
                f"{d.recorded.words() if d.recorded else 'nothing'}, replayed "
                f"{d.replayed.words() if d.replayed else 'nothing'} [{d.verdict}] {d.explanation}"
                for d in report.decisions
                if d.verdict != SAME
            ],
        }

    def close(self) -> None:
        if self.loop is not None:
            self.loop.stop()
        for timeline in self.timelines:
            timeline.stop()
        for job in self.jobs:
            # A stopped rank must be able to die when the job is cancelled.
            for proc in job_procs(job.job_id):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
            slurm(self.slurm, "scancel", job.job_id)
