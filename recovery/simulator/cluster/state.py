"""The state every part of the simulated cluster shares, and the changes all of them make.

The cluster is built in layers: ``ClusterState`` (this module: the state, saving and
restoring it, the job output and the nodes' kernel logs, the journal, and ending or requeueing
an attempt), ``BenignEvents`` (what healthy jobs, administrators and nodes do that can look like
trouble, when configured), ``TrainingJobs`` (running jobs and the faults that strike them) and
``SimulatedCluster`` (what Slurm does: commands, scheduling, the passing of time).
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from recovery.schedulers.base import CommandResult, SchedulerError
from recovery.simulator import logtext
from recovery.simulator.benign import BenignTable
from recovery.simulator.cluster.config import STATE_VERSION, SimConfig
from recovery.simulator.cluster.journal import (
    AttemptEntry,
    BenignEntry,
    BenignJournal,
    ChaosControls,
    CommandEntry,
    DroppedEntries,
    FailureEntry,
    Journal,
    append_capped,
    no_chaos,
    none_dropped,
)
from recovery.simulator.cluster.records import SimJob, SimNode
from recovery.simulator.faults import STRAGGLER, FaultKind, FaultTable


class ClusterState:
    """The cluster's state and the changes every layer makes to it."""

    rng: random.Random
    now: float
    next_job_id: int
    node_list: list[SimNode]
    nodes_by_name: dict[str, SimNode]
    jobs_by_id: dict[int, SimJob]
    dying: list[list[Any]]
    commands: list[CommandEntry]
    failures: list[FailureEntry]
    attempts: list[AttemptEntry]
    dropped: DroppedEntries
    chaos: ChaosControls
    benign_rng: random.Random
    benign: BenignJournal
    # [when, node, reason]: nodes an administrator drained, to be resumed then.
    admin_resumes: list[list[Any]]

    def __init__(
        self, config: SimConfig, state: dict[str, Any] | None = None, *, now: datetime
    ) -> None:
        self.config = config
        self.table = FaultTable(config.fault_weights)
        self.benign_table = BenignTable(config.benign_events)
        # Resolved, as Slurm reports a working directory: output under a symbolic link is not
        # read (recovery.schedulers.output_files).
        self.log_root = Path(config.log_dir).resolve() / config.name
        self._pending_lines: dict[int, list[str]] = {}
        self._pending_kernel: dict[str, list[str]] = {}
        # When this copy was loaded: a command received through it arrives then, while the
        # cluster's own clock stays at its last advance.
        self.opened_at = epoch_seconds(now)
        self._in_command = False
        if state is not None:
            self._restore(state)
            return
        self.rng = random.Random(config.seed)
        self.now = epoch_seconds(now)
        self.next_job_id = config.first_job_id
        self.node_list = [
            SimNode(f"{config.node_prefix}{i:04d}") for i in range(1, config.nodes + 1)
        ]
        self.jobs_by_id = {}
        # [time Slurm notices, node name, job id] for nodes that died under a job.
        self.dying = []
        self.commands, self.failures, self.attempts = [], [], []
        self.dropped = none_dropped()
        self.chaos = no_chaos()
        self._no_benign_events_yet()
        for node in self.node_list:
            if self.rng.random() < config.bad_node_fraction:
                kind = self.table.draw_node_level(self.rng)
                if kind is not None:
                    self._make_defective(node, kind)
        self._index_nodes()

    def to_state(self) -> dict[str, Any]:
        # Output still buffered (an injected fault's text) is written before the state is
        # saved: a saved state never has output that was lost.
        self._flush()
        version, internal, gauss = self.rng.getstate()
        state: dict[str, Any] = {
            "version": STATE_VERSION,
            "now": self.now,
            "next_job_id": self.next_job_id,
            "rng": [version, list(internal), gauss],
            "nodes": [node.to_list() for node in self.node_list],
            "jobs": [job.to_dict() for job in self.jobs_by_id.values()],
            "dying": self.dying,
            "chaos": self.chaos,
            "attempts": self.attempts,
            "failures": self.failures,
            "commands": self.commands,
            "dropped": self.dropped,
        }
        if self.benign_table.enabled:
            # Only where there are benign events: a cluster without them saves what it did.
            benign_version, benign_internal, benign_gauss = self.benign_rng.getstate()
            state["benign"] = {
                "rng": [benign_version, list(benign_internal), benign_gauss],
                "journal": self.benign,
                "admin_resumes": self.admin_resumes,
            }
        return state

    def _no_benign_events_yet(self) -> None:
        # Its own generator: benign events never change what the cluster's own draws give.
        self.benign_rng = random.Random(f"benign:{self.config.seed}")
        self.benign = {"events": [], "counts": {}, "dropped": 0}
        self.admin_resumes = []

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
            SimNode.from_list(f"{prefix}{index:04d}", values)
            for index, values in enumerate(state["nodes"], start=1)
        ]
        self.jobs_by_id = {}
        for values in state["jobs"]:
            job = SimJob.from_dict(values)
            self.jobs_by_id[job.job_id] = job
        self.dying = [list(entry) for entry in state["dying"]]
        if set(state["chaos"]) != set(no_chaos()):
            raise ValueError(f"unknown simulator chaos controls {sorted(state['chaos'])}")
        self.chaos = state["chaos"]
        self.attempts = state["attempts"]
        self.failures = state["failures"]
        self.commands = state["commands"]
        if set(state["dropped"]) != set(none_dropped()):
            raise ValueError(f"unknown simulator journal lists {sorted(state['dropped'])}")
        self.dropped = state["dropped"]
        self._no_benign_events_yet()
        benign = state.get("benign")
        if benign is not None:
            version, internal, gauss = benign["rng"]
            self.benign_rng.setstate((version, tuple(internal), gauss))
            self.benign = benign["journal"]
            self.admin_resumes = [list(entry) for entry in benign["admin_resumes"]]
        self._index_nodes()

    def journal(self) -> Journal:
        """Copies of the commands received, the failures injected and the attempts run (and
        how many older entries each list dropped)."""
        journal: Journal = {
            "commands": self.commands,
            "failures": self.failures,
            "attempts": self.attempts,
            "dropped": self.dropped,
        }
        return copy.deepcopy(journal)

    def benign_journal(self) -> BenignJournal:
        """A copy of the benign events that happened (the newest), and how many of each kind."""
        return copy.deepcopy(self.benign)

    def kernel_log_template(self) -> str:
        """Where each node's kernel log is, with ``{node}``, as a cluster's
        ``node_kernel_log`` names it."""
        return str(self.log_root / "kernel" / "{node}.log")

    def set_chaos(
        self,
        *,
        unreachable_until: float | None = None,
        timeouts_after_effect: int | None = None,
        kills_after_command: int | None = None,
    ) -> ChaosControls:
        """Replace the controls given, keep the others; returns all of them.

        An outage ends at ``unreachable_until`` (0 ends it now); a count replaces what is left.
        """
        for name, count in (
            ("timeouts_after_effect", timeouts_after_effect),
            ("kills_after_command", kills_after_command),
        ):
            if count is not None and count < 0:
                raise ValueError(f"{name} must not be negative")
        if unreachable_until is not None:
            self.chaos["unreachable_until"] = float(unreachable_until) or None
        if timeouts_after_effect is not None:
            self.chaos["timeouts_after_effect"] = timeouts_after_effect
        if kills_after_command is not None:
            self.chaos["kills_after_command"] = kills_after_command
        return copy.copy(self.chaos)

    def _index_nodes(self) -> None:
        self.nodes_by_name = {node.name: node for node in self.node_list}

    def _find(self, job_id: str | int) -> SimJob | None:
        text = str(job_id).strip()
        return self.jobs_by_id.get(int(text)) if text.isdigit() else None

    def _known(self, job_id: str, argv: tuple[str, ...]) -> SimJob:
        job = self._find(job_id)
        if job is None:
            self._refuse(argv, "Invalid job id specified")
        assert job is not None
        return job

    @contextmanager
    def _receiving(self, argv: tuple[str, ...], job_id: str, caller: str) -> Iterator[None]:
        """Journal a command received, whether it is refused (SchedulerError) or not.

        Every command checks before it changes anything, as Slurm does, so a refused one
        leaves the job as it was; ``effective`` says whether an accepted one changed it.
        """
        job = self._find(job_id)
        before = copy.deepcopy(job.to_dict()) if job is not None else None
        text = str(job_id).strip()
        entry: CommandEntry = {
            "at": max(self.now, self.opened_at),
            "argv": list(argv),
            "job_id": int(text) if text.isdigit() else None,
            "attempt": job.restart_count if job is not None else None,
            "job_state": job.state if job is not None else None,
            "returncode": 0,
            "effective": False,
            "caller": caller,
            "timed_out_after": False,
            "killed_after": False,
        }
        self.dropped["commands"] += append_capped(self.commands, entry)
        self._in_command = True
        try:
            yield
        except SchedulerError:
            entry["returncode"] = 1
            raise
        finally:
            self._in_command = False
        entry["effective"] = job is not None and job.to_dict() != before

    @staticmethod
    def _refuse(argv: tuple[str, ...], message: str) -> None:
        result = CommandResult(argv, 1, "", f"{message}\n")
        raise SchedulerError(result.describe(), result)

    def _log(self, job_id: int, lines: list[str]) -> None:
        if lines:
            self._pending_lines.setdefault(job_id, []).extend(lines)

    def _flush(self) -> None:
        if self._pending_kernel:
            folder = self.log_root / "kernel"
            folder.mkdir(parents=True, exist_ok=True)
            for node, lines in self._pending_kernel.items():
                with (folder / f"{node}.log").open("a", encoding="utf-8") as handle:
                    handle.write("\n".join(lines) + "\n")
            self._pending_kernel = {}
        if not self._pending_lines:
            return
        self.log_root.mkdir(parents=True, exist_ok=True)
        for job_id, lines in self._pending_lines.items():
            with (self.log_root / f"{job_id}.out").open("a", encoding="utf-8") as handle:
                handle.write("\n".join(lines) + "\n")
        self._pending_lines = {}

    def _log_kernel(self, node: str, lines: list[str]) -> None:
        if lines:
            self._pending_kernel.setdefault(node, []).extend(lines)

    def _record_benign(self, entry: BenignEntry) -> None:
        self.benign["dropped"] += append_capped(self.benign["events"], entry)
        counts = self.benign["counts"]
        counts[entry["kind"]] = counts.get(entry["kind"], 0) + 1

    def _checkpoint_dir(self, job: SimJob) -> str:
        return f"/checkpoints/{job.name}/{job.job_id}"

    def _context(
        self,
        job: SimJob,
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

    def _pace(self, job: SimJob) -> float:
        """Real seconds per step until the next logged step: the slowest node sets the pace."""
        slowest = max(
            (
                self.nodes_by_name[name].slow * self._benign_slowness(job, name)
                for name in job.nodes
            ),
            default=1.0,
        )
        noise = min(max(self.rng.gauss(1.0, 0.03), 0.9), 1.15)
        return job.step_seconds * slowest * noise / self.config.speedup

    @staticmethod
    def _benign_slowness(job: SimJob, name: str) -> float:
        """How much slower a benign slow rank makes ``name``'s ranks for now."""
        return job.slow_factor if name == job.slow_node else 1.0

    def _stop_benign(self, job: SimJob) -> None:
        """The attempt's process stopped (ended, requeued, stuck): no more benign events, and
        what a pause would still have printed is never printed."""
        job.benign_at, job.benign_due, job.paused_until = None, [], None

    def _draw_next_fault(self, job: SimJob, after: float) -> None:
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

    def _record_failure(
        self, job: SimJob, kind: FaultKind, at: float, *, node: str, host: str
    ) -> None:
        entry: FailureEntry = {
            "job_id": job.job_id,
            "attempt": job.restart_count,
            "attempt_started_at": job.start_time,
            "at": at,
            "kind": kind.name,
            "category": kind.category,
            "effect": kind.effect,
            "node": node,
            "host": host,
        }
        self.dropped["failures"] += append_capped(self.failures, entry)

    def _open_attempt(self, job: SimJob, at: float) -> None:
        entry: AttemptEntry = {
            "job_id": job.job_id,
            "attempt": job.restart_count,
            "started_at": at,
            "nodes": list(job.nodes),
            "ended_at": None,
            "end": None,
            "by_command": False,
        }
        self.dropped["attempts"] += append_capped(self.attempts, entry)

    def _close_attempt(self, job: SimJob, at: float, end: str) -> None:
        # From the newest, where a job's open attempt is; one already dropped stays dropped.
        for entry in reversed(self.attempts):
            if entry["job_id"] == job.job_id and entry["end"] is None:
                entry["ended_at"], entry["end"] = at, end
                entry["by_command"] = self._in_command
                return

    def _make_defective(self, node: SimNode, kind: FaultKind) -> None:
        node.defect = kind.name
        if kind.effect == STRAGGLER:
            node.slow = round(self.rng.uniform(*self.config.straggler_factor), 2)

    def _out_of_service(self, node: SimNode, at: float) -> None:
        if self.config.repair_after_seconds is not None:
            node.repair_at = at + self.config.repair_after_seconds

    def _release_nodes(self, job: SimJob) -> None:
        for name in job.nodes:
            node = self.nodes_by_name[name]
            if node.job == job.job_id:
                node.job = 0
                if node.state == "ALLOCATED":
                    node.state = "IDLE"

    def _end(
        self,
        job: SimJob,
        at: float,
        state: str,
        *,
        reason: str,
        code: int | None = None,
        signal: int | None = None,
    ) -> None:
        if job.state == "RUNNING":
            self._close_attempt(job, at, state)
        self._release_nodes(job)
        job.state, job.reason = state, reason
        job.end_time = at
        job.exit_code, job.exit_signal = (
            code if code is not None else (None if signal else 0),
            signal,
        )
        job.fault_at = None
        job.hold = ""
        self._stop_benign(job)

    def _requeue(self, job: SimJob, at: float, *, hold: bool) -> None:
        """Slurm's requeue: COMPLETING for a moment, then PENDING with the requeue delay."""
        was_running = job.state == "RUNNING"
        if was_running:
            self._close_attempt(job, at, "requeued")
        self._release_nodes(job)
        job.restart_count += 1
        job.submit_time = at
        job.eligible_time = at + self.config.requeue_delay_seconds
        job.end_time = at
        job.exit_code = job.exit_signal = None
        job.fault_at = None
        self._stop_benign(job)
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


def ok_result(argv: tuple[str, ...]) -> CommandResult:
    return CommandResult(argv, 0, "", "")


def epoch_seconds(moment: datetime) -> float:
    if moment.tzinfo is None:
        raise ValueError("the simulator needs aware datetimes (UTC)")
    return moment.timestamp()


def to_datetime(epoch: float | None) -> datetime | None:
    return None if not epoch else datetime.fromtimestamp(epoch, tz=UTC)


def natural_key(name: str) -> tuple[str, int]:
    digits = "".join(char for char in name if char.isdigit())
    return name.rstrip("0123456789"), int(digits or 0)
