"""The harness of the end-to-end scenarios: jobs, faults, the loop under test, the figures.

The loop runs as it does in production, in the test process: a thread polls the cluster every
second (``poll_cluster``, and the watchdog), and the Advisor Controller claims and carries out
recommendations through the Advisor API of pytest-django's live server. Each scenario gets its
own Cluster row (its mode, its policies, its kernel-log folder) on the shared Slurm cluster of
its version, reached as the project reaches it (local commands for 22.05, SSH for 24.11);
jobs of other scenarios and tests, still in Slurm's memory, fall under a record-only default
policy so nothing acts on them.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from django.db import close_old_connections, connection
from django.utils import timezone

from recovery.choices import (
    AuditKind,
    ClusterMode,
    Confirmation,
    RecommendationStatus,
    WorkloadState,
)
from recovery.controller.client import AdvisorClient
from recovery.controller.controller import AdvisorController
from recovery.loop.poll import adapter_for, poll_cluster
from recovery.models import (
    Anomaly,
    AuditEvent,
    Cluster,
    ControllerToken,
    Policy,
    Recommendation,
    Workload,
)
from tests.slurm_fixtures import REPO, SlurmCluster

HERE = Path(__file__).resolve().parent
JOB_SCRIPT = HERE / "jobs" / "ddp_train.sh"
PROGRAM = HERE / "jobs" / "ddp_train.py"
REPORT = Path(os.environ.get("WR_E2E_REPORT", str(REPO / "var" / "e2e" / "report.json")))
POLL_SECONDS = 1.0
CONTROLLER_SECONDS = 0.5
NODES_PER_JOB = 3
STEP_SECONDS = 0.3
CKPT_EVERY = 5
# Slurm's job states after which the job does not run again unless someone requeues it.
FINAL_JOB_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL"}
)
FINAL_WORKLOAD_STATES = frozenset(
    {WorkloadState.COMPLETED, WorkloadState.FAILED, WorkloadState.CANCELLED, WorkloadState.STOPPED}
)
STEP = re.compile(r"\bstep: (\d+)\b")

T = TypeVar("T")


# ------------------------------------------------------------------------------------------
# The report


class Report:
    """Rows of figures, one per scenario, written as JSON when the session ends."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        order = {row["scenario"]: i for i, row in enumerate(self.rows)}
        rows = sorted(self.rows, key=lambda row: order[row["scenario"]])
        partial = path.with_suffix(".tmp")
        partial.write_text(json.dumps(rows, indent=2, default=str) + "\n")
        partial.replace(path)


# ------------------------------------------------------------------------------------------
# Processes of a job on this machine


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    comm: str
    cmdline: str
    env: dict[str, str]


def read_proc(pid: int) -> Proc | None:
    base = Path("/proc") / str(pid)
    try:
        stat = (base / "stat").read_text()
        environ = (base / "environ").read_bytes()
        cmdline = (base / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None  # gone, or not ours to read
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
    env = {}
    for item in environ.split(b"\0"):
        name, sep, value = item.decode(errors="replace").partition("=")
        if sep:
            env[name] = value
    return Proc(pid, ppid, comm, cmdline, env)


def all_procs() -> list[Proc]:
    procs = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            proc = read_proc(int(entry.name))
            if proc is not None:
                procs.append(proc)
    return procs


def job_procs(job_id: str) -> list[Proc]:
    """Every process of the job: the batch script, srun, the ranks (Slurm sets their env)."""
    return [p for p in all_procs() if p.env.get("SLURM_JOB_ID") == job_id]


def rank_procs(job_id: str) -> dict[int, Proc]:
    return {
        int(p.env["SLURM_PROCID"]): p
        for p in job_procs(job_id)
        if p.comm.startswith("python") and "ddp_train.py" in p.cmdline
    }


# ------------------------------------------------------------------------------------------
# The loop under test


def _watchdog() -> Callable[[], object] | None:
    if importlib.util.find_spec("recovery.loop.watchdog") is None:
        return None
    return getattr(importlib.import_module("recovery.loop.watchdog"), "run_watchdog", None)


class Loop:
    """The poller (and watchdog) thread and, optionally, the Advisor Controller thread."""

    def __init__(self, cluster: Cluster, controller: AdvisorController | None) -> None:
        self.cluster_id = cluster.pk
        self.controller = controller
        self.errors: list[str] = []
        self.outcomes: list[tuple[float, int, str]] = []
        self.polls = 0
        self.watchdog = _watchdog()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._poll, name="e2e-poller", daemon=True)]
        if controller is not None:
            self._threads.append(
                threading.Thread(target=self._control, name="e2e-controller", daemon=True)
            )

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def _every(self, seconds: float, work: Callable[[], None]) -> None:
        try:
            while not self._stop.is_set():
                began = time.monotonic()
                try:
                    work()
                except Exception:
                    # Kept and shown by the test: a loop that raises is a finding.
                    self.errors.append(traceback.format_exc())
                    close_old_connections()
                self._stop.wait(max(0.0, seconds - (time.monotonic() - began)))
        finally:
            connection.close()

    def _poll(self) -> None:
        def once() -> None:
            cluster = Cluster.objects.get(pk=self.cluster_id)
            poll_cluster(cluster)
            self.polls += 1
            if self.watchdog is not None:
                self.watchdog()

        self._every(POLL_SECONDS, once)

    def _control(self) -> None:
        assert self.controller is not None
        controller = self.controller

        def once() -> None:
            for recommendation_id, outcome in controller.run_once():
                self.outcomes.append((time.time(), recommendation_id, outcome))

        self._every(CONTROLLER_SECONDS, once)


# ------------------------------------------------------------------------------------------
# Slurm, read directly (the harness's own view, independent of the code under test)


def slurm(
    cluster: SlurmCluster, *args: str, timeout: float = 30, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return cluster.run(list(args), timeout=timeout, env=env)


def job_fields(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    """``scontrol show job -o`` as a dict; the comment may hold spaces, so split on known keys."""
    shown = slurm(cluster, "scontrol", "show", "job", "-o", job_id)
    if shown.returncode != 0:
        return {}
    fields: dict[str, str] = {}
    for match in re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z:/]*)=(\S*)", shown.stdout):
        fields.setdefault(match.group(1), match.group(2))
    return fields


def node_states(cluster: SlurmCluster) -> dict[str, str]:
    listed = slurm(cluster, "sinfo", "-h", "-N", "-o", "%N %T")
    states: dict[str, str] = {}
    for line in listed.stdout.splitlines():
        name, _, state = line.partition(" ")
        states[name] = state.strip()
    return states


def expand_nodes(cluster: SlurmCluster, nodelist: str) -> list[str]:
    if not nodelist or nodelist == "(null)":
        return []
    shown = slurm(cluster, "scontrol", "show", "hostnames", nodelist)
    return shown.stdout.split()


class Timeline:
    """Changes of the job's and the nodes' states as Slurm reports them, with wall-clock times."""

    def __init__(self, cluster: SlurmCluster, job_id: str, started: float) -> None:
        self.cluster = cluster
        self.job_id = job_id
        self.started = started
        self.entries: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="e2e-timeline", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def note(self, what: str) -> None:
        self.entries.append({"t": round(time.time() - self.started, 2), "event": what})

    def _watch(self) -> None:
        last_job = ""
        last_nodes: dict[str, str] = {}
        while not self._stop.is_set():
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                fields = job_fields(self.cluster, self.job_id)
                job = " ".join(
                    f"{key}={fields.get(key, '')}"
                    for key in ("JobState", "Reason", "Restarts", "NodeList", "ExcNodeList")
                )
                if job != last_job:
                    self.note(f"job {job}")
                    last_job = job
                nodes = node_states(self.cluster)
                if not last_nodes:
                    self.note("nodes " + " ".join(f"{n}={s}" for n, s in sorted(nodes.items())))
                    last_nodes = dict(nodes)
                for name, state in sorted(nodes.items()):
                    if last_nodes.get(name) != state:
                        self.note(f"node {name} {state}")
                        last_nodes[name] = state
            self._stop.wait(0.5)


# ------------------------------------------------------------------------------------------
# A scenario's job


@dataclass
class E2EJob:
    job_id: str
    workdir: Path
    output: Path
    ckpt_dir: Path
    control: Path
    cluster: SlurmCluster

    def log(self) -> str:
        try:
            return self.output.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def last_step(self) -> int:
        """The highest step any rank has printed so far."""
        return max((int(m.group(1)) for m in STEP.finditer(self.log())), default=0)

    def set_faults(self, **faults: Any) -> None:
        partial = self.control.with_suffix(".tmp")
        partial.write_text(json.dumps(faults))
        partial.replace(self.control)  # the program never reads half a file

    def slurm_state(self) -> dict[str, str]:
        return job_fields(self.cluster, self.job_id)

    def ranks(self) -> dict[int, Proc]:
        return rank_procs(self.job_id)


@dataclass
class Injection:
    at: datetime
    attempt: int
    detail: dict[str, Any] = field(default_factory=dict)


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

    def submit(self, *, total_steps: int = 2000, **env: str) -> E2EJob:
        tag = uuid.uuid4().hex[:6]
        workdir = self.workdir / f"job-{tag}"
        ckpt_dir = workdir / "checkpoints"
        ckpt_dir.mkdir(parents=True)
        control = workdir / "faults.json"
        control.write_text("{}")
        output = workdir / "train.log"
        comment = {"nvidia-recovery": {"environment": self.environment, "mode": "act"}}
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
            f"--nodes={NODES_PER_JOB}",
            f"--comment={json.dumps(comment)}",
            str(JOB_SCRIPT),
            env=job_env,
        )
        assert submitted.returncode == 0, submitted.stderr
        job = E2EJob(
            submitted.stdout.strip().split(";")[0], workdir, output, ckpt_dir, control, self.slurm
        )
        self.jobs.append(job)
        self.row["job_id"] = job.job_id
        self.timeline = Timeline(self.slurm, job.job_id, self.started)
        self.timeline.start()
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
        """The report row's figures, from the audit trail and the anomaly rows.

        A crash read from a log is only a suspect until the process is seen to end, so two
        latencies are kept: ``suspect_latency_s``, from the injection to the first anomaly of
        any kind, and ``detection_latency_s``, to the moment the loop had an anomaly it may act
        on (of ``anomaly_kind`` when given): a confirmed one when it was confirmed, one that needs
        no confirmation (a hang, a straggler) when it was recorded. ``action_latency_s`` runs
        from that moment to the first scheduler action.
        """
        workload = self.workload(job)
        injection = self.injection
        if workload is None or injection is None:
            return {}
        # A poll that began just before the injection may record what the fault printed.
        since = injection.at - timedelta(seconds=2 * POLL_SECONDS)
        recent = Anomaly.objects.filter(workload=workload, detected_at__gte=since)
        anomalies = recent.filter(kind=anomaly_kind) if anomaly_kind else recent
        suspect = recent.order_by("detected_at", "pk").first()
        first = anomalies.order_by("detected_at", "pk").first()
        actionable = min(
            (at for at in map(actionable_at, anomalies) if at is not None), default=None
        )
        events = AuditEvent.objects.filter(workload=workload).order_by("occurred_at", "pk")
        actions = list(events.filter(kind=AuditKind.SCHEDULER_ACTION))
        checkpoint = (
            events.filter(kind=AuditKind.CHECKPOINT_SAVED, attempt__gt=injection.attempt)
            .order_by("occurred_at", "pk")
            .first()
        )
        recommendations = list(
            Recommendation.objects.filter(workload=workload).order_by("created_at", "pk")
        )
        acted = [
            r
            for r in recommendations
            if r.status in {RecommendationStatus.EXECUTED, RecommendationStatus.SKIPPED}
        ]
        basis = next((r.anomaly for r in acted if r.anomaly is not None), None) or next(
            (r.anomaly for r in recommendations if r.anomaly is not None), None
        )
        action_after = [a for a in actions if actionable is not None and a.occurred_at >= since]
        per_recommendation: dict[Any, int] = {}
        for action in actions:
            key = action.payload.get("recommendation")
            per_recommendation[key] = per_recommendation.get(key, 0) + 1

        def after_injection(at: datetime | None) -> float | None:
            if at is None:
                return None
            return round(max(0.0, (at - injection.at).total_seconds()), 2)

        figures: dict[str, Any] = {
            "suspect_latency_s": after_injection(suspect.detected_at if suspect else None),
            "detection_latency_s": after_injection(actionable),
            "action_latency_s": None
            if actionable is None or not action_after
            else round((action_after[0].occurred_at - actionable).total_seconds(), 2),
            "time_to_new_checkpoint_s": None
            if checkpoint is None
            else round((checkpoint.occurred_at - injection.at).total_seconds(), 2),
            "attribution": (basis or first).attribution if (basis or first) else None,
            "acted_on": None
            if basis is None
            else {"kind": basis.kind, "confirmation": basis.confirmation},
            "scheduler_actions": len(actions),
            "duplicate_actions": sum(n - 1 for n in per_recommendation.values()),
        }
        node = injection.detail.get("node")
        if node:
            implicating = next(
                (a for a in anomalies.order_by("detected_at", "pk") if node in a.implicated_nodes),
                None,
            )
            figures["node_implicated_after_s"] = (
                None
                if implicating is None
                else round((implicating.detected_at - injection.at).total_seconds(), 2)
            )
        figures["details"] = {
            "fault": injection.detail,
            "anomalies": [
                {
                    "kind": a.kind,
                    "category": a.category,
                    "attribution": a.attribution,
                    "signature": a.signature,
                    "nodes": a.implicated_nodes,
                    "ranks": a.implicated_ranks,
                    "attempt": a.attempt.number if a.attempt else None,
                    "after_injection_s": round((a.detected_at - injection.at).total_seconds(), 2),
                    "confirmation": a.confirmation,
                    "confirmed_after_s": None
                    if a.confirmation_at is None
                    else round((a.confirmation_at - injection.at).total_seconds(), 2),
                    "confirmation_reason": a.confirmation_reason[:200],
                    "evidence": a.evidence_line[:200],
                }
                for a in Anomaly.objects.filter(workload=workload).order_by("detected_at", "pk")
            ],
            "recommendations": [
                {
                    "id": r.pk,
                    "action": r.action,
                    "status": r.status,
                    "excluded_nodes": r.excluded_nodes,
                    "reason": r.reason[:300],
                    "anomaly": r.anomaly_id,
                }
                for r in recommendations
            ],
            "events": [
                {
                    "t": round((e.occurred_at - injection.at).total_seconds(), 2),
                    "attempt": e.attempt,
                    "kind": e.kind,
                    "actor": e.actor,
                    "summary": _summary(e),
                }
                for e in events
                if e.kind not in {AuditKind.CHECKPOINT_SAVED}
                or e.attempt is None
                or e.attempt > injection.attempt
            ][:80],
        }
        return figures

    def record(self, **extra: Any) -> None:
        self.row.update(extra)

    def finish(self, failure: str | None) -> None:
        """Complete the report row; called after the test, before the database is flushed."""
        try:
            if self.jobs:
                self.row.update(self.figures(self.jobs[0], anomaly_kind=self.anomaly_kind))
        except Exception:
            self.row.setdefault("figures_error", traceback.format_exc()[-2000:])
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

    def close(self) -> None:
        if self.loop is not None:
            self.loop.stop()
        if self.timeline is not None:
            self.timeline.stop()
        for job in self.jobs:
            # A stopped rank must be able to die when the job is cancelled.
            for proc in job_procs(job.job_id):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
            slurm(self.slurm, "scancel", job.job_id)


def actionable_at(anomaly: Anomaly) -> datetime | None:
    """When the loop could act on ``anomaly``: a crash once it was confirmed (never while only
    suspected, nor when it was survived or stalled), an anomaly that needs no confirmation (a
    hang, a straggler) once recorded."""
    if anomaly.confirmation == Confirmation.CONFIRMED:
        return anomaly.confirmation_at or anomaly.detected_at
    if not anomaly.confirmation:
        return anomaly.detected_at
    return None


def _summary(event: AuditEvent) -> str:
    payload = event.payload or {}
    if event.kind == AuditKind.SCHEDULER_ACTION:
        commands = " ; ".join(" ".join(c.get("argv", [])[:3]) for c in payload.get("commands", []))
        return f"{payload.get('action')} {payload.get('excluded_nodes')}: {commands}"
    keys = ("to", "category", "attribution", "nodes", "action", "excluded_nodes", "step", "reason")
    return ", ".join(f"{k}={payload[k]}" for k in keys if k in payload)[:300]
