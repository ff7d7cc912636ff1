"""The scheduler interface: what the poller and the Advisor Controller need from any scheduler.

A scheduler adapter lists jobs and nodes and carries out recovery actions. It talks to the
scheduler through a ``Transport`` (local commands, SSH), always with argument lists, never a
shell string, and validates job ids and node names before any command runs.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Protocol

from recovery.schedulers.capabilities import Capabilities
from recovery.schedulers.compat import StrEnum
from recovery.schedulers.optin import OptIn
from recovery.schedulers.output_files import OutputAccess, OutputFile, OutputRefused
from recovery.schedulers.phase import Phase
from recovery.schedulers.validation import validate_job_id, validate_node_names


class SchedulerError(Exception):
    """A scheduler command failed; the message names the command and what it printed."""

    def __init__(self, message: str, result: CommandResult | None = None) -> None:
        super().__init__(message)
        self.result = result


class ExpeditedRequeueUnavailable(SchedulerError):
    """No expedited requeue for this job here; nothing was run (use the ordinary requeue)."""


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def describe(self) -> str:
        output = (self.stderr or self.stdout).strip().splitlines()
        said = output[-1][:300] if output else "no output"
        return f"`{' '.join(self.argv)}` exited {self.returncode}: {said}"


class Command(StrEnum):
    """A scheduler command that changes something, named as ``SchedulerAdapter.planned_argv``
    takes it: one per action method (``requeue`` with and without ``hold``, the expedited
    requeue, ``set_excluded_nodes``...). Reads are not commands here."""

    REQUEUE = "requeue"
    REQUEUE_HOLD = "requeuehold"
    REQUEUE_EXPEDITED = "requeue_expedited"
    SET_EXCLUDED_NODES = "set_excluded_nodes"
    CLEAR_START_DELAY = "clear_start_delay"
    RELEASE = "release"
    HOLD = "hold"
    CANCEL = "cancel"
    DISABLE_REQUEUE = "disable_requeue"
    # Node commands: ``planned_node_argv`` takes them.
    DRAIN_NODE = "drain_node"
    RESUME_NODE = "resume_node"


# Every drain recovery asks for carries this reason prefix: it is how a drain is known to be
# recovery's own (only those are resumed by it) and how the poller tells its own word from new
# evidence about the node.
DRAIN_REASON_PREFIX = "workload-recovery:"
MAX_DRAIN_REASON_LENGTH = 200
# Quotes and backslashes survive an argv but not every tool that shows the reason again.
UNSAFE_IN_REASON = frozenset("\"'\\`")


def drain_reason(verdict: str) -> str:
    """Slurm's ``Reason=`` for a drain on ``verdict``: prefixed, one printable line, bounded.

    The verdict is built from evidence text (an Xid message, a node's state reason); anything a
    terminal or Slurm's state file would take badly is replaced, not passed on.
    """
    text = "".join(
        " " if char in UNSAFE_IN_REASON or not char.isprintable() else char for char in verdict
    )
    text = " ".join(text.split())
    if text.startswith(DRAIN_REASON_PREFIX):
        text = text[len(DRAIN_REASON_PREFIX) :].strip()
    return f"{DRAIN_REASON_PREFIX} {text}"[:MAX_DRAIN_REASON_LENGTH].rstrip()


def is_recovery_drain(reason: str) -> bool:
    return reason.strip().startswith(DRAIN_REASON_PREFIX)


def _listed_order(name: str) -> tuple[str, int]:
    """The order the simulated Slurm lists a job's excluded nodes in: by the name without its
    trailing digits, then by all its digits as one number (``natural_key`` in
    ``recovery/simulator/cluster/state.py``; ``tests/controller/test_dispatch.py`` checks that
    the two agree)."""
    digits = "".join(char for char in name if char.isdigit())
    return name.rstrip("0123456789"), int(digits or 0)


class Connection(StrEnum):
    """How a cluster's scheduler is reached: a cluster's ``connection``, the registry's key.

    The one definition of these values: ``recovery.choices.Connection`` wraps it for the models
    and forms. Stored with every cluster: the values must not change.
    """

    # Slurm's commands run on this host.
    LOCAL = "local"
    # Slurm's commands run on a login node over SSH.
    SSH = "ssh"
    # A simulation stands in for the scheduler (or a recorded demo history, never polled).
    SIMULATED = "simulated"


class Transport(Protocol):
    name: str

    def run(self, argv: Sequence[str], *, timeout: float = 30.0) -> CommandResult:
        """Run one command given as an argument list and return what it did."""
        ...

    def read_file(self, path: str, offset: int, limit: int) -> bytes:
        """Up to ``limit`` bytes of ``path`` from ``offset`` (empty when nothing new)."""
        ...

    def file_size(self, path: str) -> int | None:
        """The size of ``path``, or None when it does not exist."""
        ...

    def open_output(self, path: str, access: OutputAccess) -> OutputFile | None:
        """A job's output file opened under ``access`` (see ``output_files``), or None when it
        does not exist. Raises ``OutputRefused`` when the rules forbid reading it.

        ``read_file`` and ``file_size`` are for paths an administrator set (kernel logs); a
        path a job chose is only ever read through this (or ``open_outputs``).
        """
        ...

    def output_sizes(self, paths: Sequence[str]) -> dict[str, int | None]:
        """Each path's size as ``lstat`` sees it (a link is not followed), or None when it is
        missing or cannot be looked at: a hint whether a job wrote more, never a reason to read.
        One exchange for all the paths, not one per path."""
        ...

    def open_outputs(
        self,
        wanted: Mapping[str, int],
        access: OutputAccess | Mapping[str, OutputAccess],
        limit: int,
    ) -> dict[str, OutputFile | OutputRefused | None]:
        """Many job output files opened at once under the rules ``open_output`` applies (one
        ``access`` for all, or one per path), each with up to ``limit`` bytes from its offset in
        ``wanted`` already read: a read of that range costs nothing more, any other goes back to
        the file. Keyed like ``wanted``: the file, None when it does not exist, or the refusal
        (one file refused never fails the others). Raises ``SchedulerError`` when the files
        cannot be reached at all.
        """
        ...


@dataclass(frozen=True)
class JobInfo:
    """One job as the scheduler reports it now.

    A fact the scheduler's output did not give, or gave in a shape this reader does not know, is
    ``None`` (unknown), never a default: ``unreadable`` maps each such field to the reason. The
    fields the loop acts on are listed in ``ACTIONABLE_FIELDS``; nothing acts on a job while one
    of them is unknown.
    """

    job_id: str
    name: str
    user: str  # "" when unknown (listed in ``unreadable``)
    partition: str
    # The scheduler's own word for the job's state (Slurm's RUNNING, NODE_FAIL...): for people
    # to read, and for the scheduler's own adapter and executor. None when unreadable.
    native_state: str | None
    # Where the job is in its life, as the adapter maps ``native_state``: what the loop reads.
    # None exactly when ``native_state`` is.
    phase: Phase | None
    reason: str
    comment: str
    opt_in: OptIn
    # The rest of the scheduler's state besides ``native_state``: flags such as REQUEUED, and,
    # when it is COMPLETING, the base state underneath (PENDING after a requeue, FAILED...).
    state_flags: tuple[str, ...] = ()
    # Slurm's job flags (23.02 and later), e.g. EXPEDITED_REQUEUE; empty where none were read.
    job_flags: tuple[str, ...] = ()
    nodes: list[str] = field(default_factory=list)
    excluded_nodes: list[str] | None = None
    restart_count: int | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    requeue_allowed: bool | None = None
    held: bool | None = None
    stdout_path: str = ""
    stderr_path: str = ""
    work_dir: str = ""
    # The uid of ``user``. Only reading the job's output files needs it: they are read only when
    # this uid owns them. None when unknown (listed in ``unreadable``).
    user_uid: int | None = None
    submit_time: datetime | None = None
    # The account the job is charged to. Where the site enforces associations, Slurm takes
    # only an account the site gave the user. "" where the site keeps no accounts; None when
    # unknown (listed in ``unreadable``).
    account: str | None = None
    # The jobs this one waits for with ``afterany`` or ``afternotok`` (``dependency``): the
    # jobs it follows in a workflow. Slurm shows a dependency only until it is satisfied, so
    # ``()`` says "none now", not "never". None when unknown (listed in ``unreadable``).
    chained_after: tuple[str, ...] | None = None
    eligible_time: datetime | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None
    unreadable: dict[str, str] = field(default_factory=dict)

    @property
    def is_running(self) -> bool:
        return self.phase == Phase.RUNNING

    @property
    def is_pending(self) -> bool:
        return self.phase == Phase.PENDING

    def unknown(self, fields: Sequence[str] = ()) -> dict[str, str]:
        """The given fields (all that the loop acts on by default) that could not be read."""
        wanted = fields or ACTIONABLE_FIELDS
        missing = {}
        for name in wanted:
            value = getattr(self, name)
            if value is None or (name == "user" and not value):
                missing[name] = self.unreadable.get(name, "not reported by the scheduler")
        return missing


def describe_unknown(unknown: dict[str, str]) -> str:
    """``JobInfo.unknown()`` in one line: ``phase: why; restart_count: why``."""
    return "; ".join(f"{name}: {why}" for name, why in sorted(unknown.items()))


# What the Advisor Controller and the poller rely on to tell a job's identity and its progress
# through a restart. With one of these unknown, nothing is done to the job or its workload.
ACTIONABLE_FIELDS = (
    "phase",
    "user",
    "submit_time",
    "restart_count",
    "excluded_nodes",
    "requeue_allowed",
    "held",
)


@dataclass(frozen=True)
class NodeInfo:
    """One node as the scheduler reports it now.

    As with ``JobInfo``, a fact the scheduler's output did not give, or gave in a shape this
    reader does not know, is ``None`` (unknown), never a default: ``unreadable`` maps each such
    field to the reason. With its state or its reason unknown (``unknown()``), recovery neither
    drains nor resumes the node.
    """

    name: str
    # The base state (IDLE, MIXED, ALLOCATED, DOWN...); None when unknown.
    state: str | None
    # Every other word of the state as Slurm gave it: DRAIN, NOT_RESPONDING, MAINTENANCE...
    # When the state is unknown, the words that were read (for showing, never for deciding).
    flags: list[str] = field(default_factory=list)
    # Why the node is out of service, as whoever took it out wrote it; "" when there is none,
    # None when unknown.
    reason: str | None = ""
    # Who set the reason and when, where the scheduler says (Slurm's ``Reason=... [user@time]``);
    # "" and None otherwise, and always when there is no reason.
    reason_set_by: str = ""
    reason_set_at: datetime | None = None
    unreadable: dict[str, str] = field(default_factory=dict)

    @property
    def unavailable(self) -> bool:
        """Down, drained or failing: no new work lands here. False while the state is unknown,
        as ``drained`` is: neither says the node is in service (``in_service`` does)."""
        return bool(self._markers & {"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING"})

    @property
    def drained(self) -> bool:
        """Drained or draining: the scheduler starts no new job here until it is resumed."""
        return bool(self._markers & DRAIN_FLAGS)

    @property
    def _markers(self) -> set[str]:
        """The state's words; none while the state is unknown (a word read then is no fact)."""
        if self.state is None:
            return set()
        return {self.state.upper(), *(flag.upper() for flag in self.flags)}

    def unknown(self) -> dict[str, str]:
        """The facts recovery decides a node's ownership by (its state and reason) that could
        not be read."""
        missing = {}
        for name in NODE_ACTIONABLE_FIELDS:
            if getattr(self, name) is None:
                missing[name] = self.unreadable.get(name, "not reported by the scheduler")
        return missing

    def facts(self) -> dict[str, Any]:
        """The node as read, for a report or the trail; what could not be read is named."""
        facts: dict[str, Any] = {
            "node": self.name,
            "state": self.state,
            "flags": list(self.flags),
            "reason": self.reason[:500] if self.reason is not None else None,
        }
        if self.reason_set_by:
            facts["reason_set_by"] = self.reason_set_by
        if self.reason_set_at is not None:
            facts["reason_set_at"] = self.reason_set_at.isoformat()
        if self.unreadable:
            facts["unreadable"] = dict(self.unreadable)
        return facts

    def describe(self) -> str:
        """The state and reason as read, in one line: ``DOWN+DRAIN, reason 'RMA 4411' (set by
        root, 2026-12-03T09:30:00+00:00)``."""
        state = "+".join([self.state or "unknown state", *self.flags])
        if self.reason is None:
            return f"{state}, reason unknown"
        if not self.reason:
            return f"{state}, no reason"
        said = ", ".join(
            part
            for part in (
                self.reason_set_by,
                self.reason_set_at.isoformat() if self.reason_set_at else "",
            )
            if part
        )
        return f"{state}, reason {self.reason[:200]!r}" + (f" (set by {said})" if said else "")


# What recovery decides a node's ownership by: with one unknown, it neither drains nor resumes.
NODE_ACTIONABLE_FIELDS = ("state", "reason")
# A node in service is in one of these base states (COMPLETING is a flag in Slurm, a base
# state in some of its listings)...
IN_SERVICE_STATES = frozenset({"IDLE", "MIXED", "ALLOCATED", "COMPLETING"})
# ...with no flag but these. Any other flag (DOWN, DRAIN, FAIL, MAINTENANCE, REBOOT_REQUESTED,
# POWER_DOWN, POWERED_DOWN, NOT_RESPONDING, INVALID_REG..., and any flag this list does not
# know) says that an administrator or Slurm itself took the node out, or may have: the node is
# theirs, not recovery's.
IN_SERVICE_FLAGS = frozenset({"COMPLETING", "RESERVED", "PLANNED", "CLOUD", "DYNAMIC_NORM"})
# A node that stopped answering and that Slurm has not yet set DOWN is still in service as its
# state goes, and a hardware fault on it is what a drain is for: recovery may drain it (once
# Slurm sets it DOWN, it is Slurm's). Nothing is resumed while it does not answer.
DRAINABLE_FLAGS = IN_SERVICE_FLAGS | {"NOT_RESPONDING"}
# DRAIN is Slurm's flag; DRAINED and DRAINING are the words its short listings show for it.
DRAIN_FLAGS = frozenset({"DRAIN", "DRAINED", "DRAINING"})


def in_service(node: NodeInfo, flags: frozenset[str] = IN_SERVICE_FLAGS) -> bool:
    """Read, in an in-service base state, and with no flag but ``flags`` (those of a node in
    service unless told)."""
    if node.unknown() or (node.state or "").upper() not in IN_SERVICE_STATES:
        return False
    return all(flag.upper() in flags for flag in node.flags)


def drained_by_recovery(node: NodeInfo) -> bool:
    """Drained, with recovery's own reason: a drain recovery asked for is in place."""
    return not node.unknown() and node.drained and is_recovery_drain(node.reason or "")


def drain_refusal(node: NodeInfo) -> str:
    """Why recovery may not drain ``node`` as read, or "" when it may.

    Recovery drains only a node in service (``in_service``; one that stopped answering too,
    until Slurm sets it DOWN: ``DRAINABLE_FLAGS``). A node an administrator or Slurm
    took out (DOWN, DRAIN, FAIL, MAINTENANCE, a reboot, a power state, each with their reason)
    is theirs: a drain would replace their reason with recovery's, and recovery's resume would
    then put the node back in service. A node whose state or reason is unknown is not drained
    either.

    A reason on a node in service keeps nothing out: it is what Slurm kept from the last time
    the node was out (24.11 keeps it after a resume, and no command clears it; 22.05 clears
    it). Whoever wrote it, the node was back in service, and a drain takes it from there. A
    reason that still holds comes with its flag (DRAIN, FAIL, REBOOT_REQUESTED...), refused
    above.
    """
    unknown = node.unknown()
    if unknown:
        return f"the state of {node.name} is unknown ({describe_unknown(unknown)})"
    if not in_service(node, DRAINABLE_FLAGS):
        return (
            f"{node.name} is out of service ({node.describe()}): taken out by an administrator "
            "or by Slurm, it is theirs to bring back"
        )
    return ""


def resume_refusal(node: NodeInfo) -> str:
    """Why recovery may not resume ``node`` as read, or "" when it may.

    Recovery resumes only its own drain of a node nothing else keeps out of service: drained
    with recovery's reason, in an in-service base state, with no flag but the drain and those
    of a node in service. A node an administrator then set DOWN, put in maintenance, or gave
    their own reason, stays as they left it.
    """
    unknown = node.unknown()
    if unknown:
        return f"the state of {node.name} is unknown ({describe_unknown(unknown)})"
    if not node.drained:
        return f"{node.name} is not drained ({node.describe()})"
    if not is_recovery_drain(node.reason or ""):
        return f"{node.name} was drained by someone else ({node.reason or 'no reason'})"
    if not in_service(node, DRAIN_FLAGS | IN_SERVICE_FLAGS):
        return (
            f"{node.name} is {node.describe()}: more than recovery's drain keeps it out of "
            "service now, and only an administrator or Slurm brings it back"
        )
    return ""


class SchedulerAdapter(abc.ABC):
    """What every scheduler offers. Actions raise ``SchedulerError`` when refused.

    ``transport`` reaches the hosts the jobs run on: the poller reads the jobs' output files and
    the nodes' kernel logs through it. None where there is no such host to reach.
    """

    transport: Transport | None = None
    # What this adapter can do; none of it unless the adapter says so.
    capabilities: ClassVar[Capabilities] = Capabilities()

    @abc.abstractmethod
    def list_jobs(self) -> list[JobInfo]: ...

    @abc.abstractmethod
    def get_job(self, job_id: str) -> JobInfo | None: ...

    @abc.abstractmethod
    def list_nodes(self) -> list[NodeInfo]: ...

    def get_node(self, name: str) -> NodeInfo | None:
        """The node as the scheduler reports it now, or None when it does not know it.

        Raises ``SchedulerError`` when the nodes cannot be read: unknown, not absent.
        """
        name = validate_node_names([name])[0]
        return next((node for node in self.list_nodes() if node.name == name), None)

    def drain_node(self, name: str, reason: str) -> CommandResult:
        """Drain ``name`` with ``reason``: running jobs finish, no new one starts there."""
        return self._unsupported(self.planned_node_argv(Command.DRAIN_NODE, name, reason))

    def resume_node(self, name: str) -> CommandResult:
        """Return a drained ``name`` to service."""
        return self._unsupported(self.planned_node_argv(Command.RESUME_NODE, name))

    @staticmethod
    def _unsupported(argv: tuple[str, ...]) -> CommandResult:
        result = CommandResult(argv, 1, "", "this scheduler adapter cannot change nodes\n")
        raise SchedulerError(result.describe(), result)

    def planned_node_argv(self, command: Command, name: str, reason: str = "") -> tuple[str, ...]:
        """The exact command line of a node command, known before it runs (as ``planned_argv``).

        Raises ``InvalidIdentifier`` for a node name no command may carry, ``ValueError`` for
        a drain without recovery's reason.
        """
        name = validate_node_names([name])[0]
        if command == Command.DRAIN_NODE:
            if not is_recovery_drain(reason) or reason != drain_reason(reason):
                raise ValueError(f"not a drain reason recovery writes: {reason[:80]!r}")
            return ("scontrol", "update", f"NodeName={name}", "State=DRAIN", f"Reason={reason}")
        if command == Command.RESUME_NODE:
            return ("scontrol", "update", f"NodeName={name}", "State=RESUME")
        raise AssertionError(f"no node command line for {command!r}")

    @abc.abstractmethod
    def requeue(self, job_id: str, *, hold: bool = False) -> CommandResult: ...

    @abc.abstractmethod
    def set_excluded_nodes(self, job_id: str, nodes: Sequence[str]) -> CommandResult: ...

    @abc.abstractmethod
    def clear_start_delay(self, job_id: str) -> CommandResult: ...

    @abc.abstractmethod
    def release(self, job_id: str) -> CommandResult: ...

    @abc.abstractmethod
    def hold(self, job_id: str) -> CommandResult: ...

    @abc.abstractmethod
    def cancel(self, job_id: str) -> CommandResult: ...

    @abc.abstractmethod
    def disable_requeue(self, job_id: str) -> CommandResult: ...

    def planned_argv(
        self, command: Command, job_id: str, nodes: Sequence[str] = ()
    ) -> tuple[str, ...]:
        """The exact command line ``command`` runs on ``job_id`` (``nodes``: the exclusions of
        ``SET_EXCLUDED_NODES``), known before it runs.

        The Advisor Controller records it in the trail before running the command, so that a
        command the scheduler carried out is never missing from the trail, even when the
        controller is killed right after it. Both adapters here speak Slurm: this is Slurm's
        command line, which the Slurm adapter builds its commands from and the simulator
        imitates; an adapter for another scheduler overrides it. Raises ``InvalidIdentifier``
        for an id or a node name no command may carry.
        """
        job_id = validate_job_id(job_id)
        if command == Command.SET_EXCLUDED_NODES:
            names = self.excluded_nodes_value(nodes)
            return ("scontrol", "update", f"JobId={job_id}", f"ExcNodeList={names}")
        lines = {
            Command.REQUEUE: ("scontrol", "requeue", job_id),
            Command.REQUEUE_EXPEDITED: ("scontrol", "requeue", job_id),
            Command.REQUEUE_HOLD: ("scontrol", "requeuehold", job_id),
            Command.CLEAR_START_DELAY: ("scontrol", "update", f"JobId={job_id}", "StartTime=now"),
            Command.RELEASE: ("scontrol", "release", job_id),
            Command.HOLD: ("scontrol", "hold", job_id),
            Command.CANCEL: ("scancel", job_id),
            Command.DISABLE_REQUEUE: ("scontrol", "update", f"JobId={job_id}", "Requeue=0"),
        }
        if command not in lines:
            raise AssertionError(f"no command line for {command!r}")
        return lines[command]

    def excluded_nodes_value(self, nodes: Sequence[str]) -> str:
        """The value of ``ExcNodeList=`` for ``nodes``: here each name once, comma-separated, in
        the order the simulated Slurm writes them; Slurm's adapter compresses the list."""
        return ",".join(sorted(set(validate_node_names(nodes)), key=_listed_order))

    def scheduler_version(self) -> str | None:
        """The scheduler's version (``24.11.5``), or None when unknown."""
        return None

    def cluster_name(self) -> str | None:
        """The name the scheduler gives its cluster (Slurm's ClusterName), or None."""
        return None

    def supports_expedited_requeue(self) -> bool:
        """Whether the scheduler itself restarts a requeued job at once, at top priority."""
        return False

    def requeue_expedited(self, job_id: str) -> CommandResult:
        """Requeue through the scheduler's expedited path; refused where there is none."""
        raise ExpeditedRequeueUnavailable(f"this scheduler has no expedited requeue (job {job_id})")
