"""The scheduler interface: what the poller and the Advisor Controller need from any scheduler.

A scheduler adapter lists jobs and nodes and carries out recovery actions. It talks to the
scheduler through a ``Transport`` (local commands, SSH), always with argument lists, never a
shell string, and validates job ids and node names before any command runs.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from recovery.schedulers.optin import OptIn


class SchedulerError(Exception):
    """A scheduler command failed; the message names the command and what it printed."""

    def __init__(self, message: str, result: CommandResult | None = None) -> None:
        super().__init__(message)
        self.result = result


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


@dataclass(frozen=True)
class JobInfo:
    """One job as the scheduler reports it now."""

    job_id: str
    name: str
    user: str
    partition: str
    state: str
    reason: str
    comment: str
    opt_in: OptIn
    nodes: list[str] = field(default_factory=list)
    excluded_nodes: list[str] = field(default_factory=list)
    restart_count: int = 0
    exit_code: int | None = None
    exit_signal: int | None = None
    requeue_allowed: bool = True
    held: bool = False
    stdout_path: str = ""
    stderr_path: str = ""
    work_dir: str = ""
    submit_time: datetime | None = None
    eligible_time: datetime | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None

    @property
    def is_running(self) -> bool:
        return self.state == "RUNNING"

    @property
    def is_pending(self) -> bool:
        return self.state == "PENDING"


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str
    flags: list[str] = field(default_factory=list)
    reason: str = ""

    @property
    def unavailable(self) -> bool:
        """Down, drained or failing: no new work lands here."""
        markers = {self.state.upper(), *(flag.upper() for flag in self.flags)}
        return bool(markers & {"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING"})


class SchedulerAdapter(abc.ABC):
    """What every scheduler offers. Actions raise ``SchedulerError`` when refused."""

    @abc.abstractmethod
    def list_jobs(self) -> list[JobInfo]: ...

    @abc.abstractmethod
    def get_job(self, job_id: str) -> JobInfo | None: ...

    @abc.abstractmethod
    def list_nodes(self) -> list[NodeInfo]: ...

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
