"""What the simulated cluster remembers of its own history, and the chaos a harness injects.

A chaos test checks the control plane against this ground truth: every command the scheduler
received (refused ones too), every fault that struck an attempt, and how every attempt ended.
The journal is part of the cluster's state, so a change and its entry are saved in one write:
a process killed between them cannot leave a command applied but not journaled, or the reverse.
Each list keeps its newest ``JOURNAL_LIMIT`` entries and counts the ones it dropped.

The chaos controls are off unless a harness sets them (``BaseSimulationStore.set_chaos``); the
simulated adapter acts on them, since they are about how its callers reach the scheduler.
"""

from __future__ import annotations

from typing import Any, TypedDict, TypeVar

from recovery.simulator.cluster.config import JOURNAL_LIMIT


class CommandEntry(TypedDict):
    """A command the scheduler received, as it found the job then."""

    at: float  # epoch seconds
    argv: list[str]
    job_id: int | None  # None: not a job id at all
    attempt: int | None  # the job's restart_count when received; None: unknown job
    job_state: str | None
    returncode: int  # 0 accepted, 1 refused
    effective: bool  # it changed the job
    caller: str  # the adapter user's label (WR_SIM_CALLER, else pid:<pid>)
    timed_out_after: bool  # the caller was told it timed out, after it took effect
    killed_after: bool  # the caller was killed after it took effect


class FailureEntry(TypedDict):
    """A fault that struck an attempt."""

    job_id: int
    attempt: int  # restart_count of the attempt it struck
    attempt_started_at: float | None
    at: float  # when it struck
    kind: str  # a name in recovery.simulator.faults.KINDS
    category: str
    effect: str
    node: str  # the node a node-level kind blames, else ""
    # The node the fault showed on (the rank that raised, the one that hung), whatever its kind;
    # "" for a time limit. Absent from entries journaled before it was kept.
    host: str


class AttemptEntry(TypedDict):
    """One run of a job on its nodes: open (``end`` None) until it ends or is requeued."""

    job_id: int
    attempt: int  # the job's restart_count during the attempt
    started_at: float
    nodes: list[str]
    ended_at: float | None
    end: str | None  # the job's finished state, or "requeued"
    by_command: bool  # ended by a command received (else by the job or by Slurm itself)


class BenignEntry(TypedDict):
    """A benign event (``recovery.simulator.benign``) that happened to a running attempt."""

    job_id: int
    attempt: int  # restart_count of the attempt
    at: float
    kind: str  # a name in recovery.simulator.benign.KINDS
    node: str  # the node it concerns (a slow rank, a drain, a kernel line), else ""
    until: float | None  # when a pause, a slowdown or a drain ends
    detail: dict[str, Any]  # what was printed: corpus id and source, Xid code, pause kind


class BenignJournal(TypedDict):
    """The benign events, the newest ``JOURNAL_LIMIT`` of them, and a count of all by kind."""

    events: list[BenignEntry]
    counts: dict[str, int]
    dropped: int


class DroppedEntries(TypedDict):
    """Entries dropped per list, oldest first, to keep each at ``JOURNAL_LIMIT``."""

    commands: int
    failures: int
    attempts: int


class Journal(TypedDict):
    commands: list[CommandEntry]
    failures: list[FailureEntry]
    attempts: list[AttemptEntry]
    dropped: DroppedEntries


class ChaosControls(TypedDict):
    # Until then (epoch seconds) no call reaches the scheduler; None: reachable.
    unreachable_until: float | None
    # The next so many effective commands take effect, then their caller sees a timeout.
    timeouts_after_effect: int
    # The next so many effective commands of a killable caller take effect, then it is killed.
    kills_after_command: int
    # Commands refused during outages (they never reached the scheduler, so are not journaled).
    refused_while_unreachable: int


def no_chaos() -> ChaosControls:
    return {
        "unreachable_until": None,
        "timeouts_after_effect": 0,
        "kills_after_command": 0,
        "refused_while_unreachable": 0,
    }


Entry = TypeVar("Entry", CommandEntry, FailureEntry, AttemptEntry, BenignEntry)


def none_dropped() -> DroppedEntries:
    return {"commands": 0, "failures": 0, "attempts": 0}


def append_capped(entries: list[Entry], entry: Entry) -> int:
    """Append ``entry``, dropping the oldest beyond ``JOURNAL_LIMIT``; how many were dropped."""
    entries.append(entry)
    excess = len(entries) - JOURNAL_LIMIT
    if excess <= 0:
        return 0
    del entries[:excess]
    return excess
