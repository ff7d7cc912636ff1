"""What a controller reports of one recommendation, and the checks every scheduler's job passes
before any command: the job is the recommendation's (its user, a submit time that fits) and its
owner left the action to the loop.

Neutral: no scheduler's states are read here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from recovery.controller.client import ReadyRecommendation
from recovery.schedulers.base import JobInfo, NodeInfo, SchedulerError
from recovery.schedulers.nodelist import NodeListError, compress_nodelist
from recovery.schedulers.optin import OptInMode

# A report's job snapshot stays below the API's 16 KiB limit on ``state_before``.
MAX_SNAPSHOT_BYTES = 12 * 1024
NODE_LIST_KEYS = ("nodes", "excluded_nodes")


class MisconfiguredController(Exception):
    """The controller's token, ``--cluster`` and scheduler do not belong together."""


class Retry(Exception):
    """Not finished now; the recommendation goes back to be taken up from the scheduler's state."""


class NotRestarted(Exception):
    """The job runs an attempt after the recommendation's: there is nothing to restart."""


class EffectUnknown(SchedulerError):
    """A command timed out or lost its connection: it may or may not have taken effect."""


class NotOwned(Exception):
    """The node, as read, is not recovery's to drain or resume: nothing is run on it."""


# A job's submit time as Slurm reports it and as the control plane stored it may differ by
# rounding; a requeue sets it to the moment of the requeue.
SUBMIT_TIME_TOLERANCE = timedelta(seconds=1)


@dataclass
class Outcome:
    outcome: str  # executed, skipped, failed or retry
    state_before: dict[str, Any]
    commands: list[dict[str, Any]] = field(default_factory=list)
    converged: bool | None = None
    detail: str = ""

    def body(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "state_before": self.state_before,
            "commands": self.commands,
            "converged": self.converged,
            "detail": self.detail[:2000],
        }

    @property
    def acted(self) -> bool:
        return any(command["returncode"] == 0 for command in self.commands)


def job_snapshot(job: JobInfo | None) -> dict[str, Any]:
    if job is None:
        return {"known": False}
    snapshot: dict[str, Any] = {
        "known": True,
        "job_state": job.native_state,
        "reason": job.reason,
        "user": job.user,
        "submit_time": job.submit_time.isoformat() if job.submit_time else None,
        "restart_count": job.restart_count,
        "nodes": job.nodes,
        "excluded_nodes": job.excluded_nodes,
        "held": job.held,
        "requeue_allowed": job.requeue_allowed,
    }
    if job.unreadable:
        snapshot["unreadable"] = dict(job.unreadable)
    return fit_snapshot(snapshot)


def node_snapshot(node: NodeInfo | None) -> dict[str, Any]:
    """The node as read, for the report: state, flags, reason (and who set it when, where
    Slurm says), and what could not be read."""
    if node is None:
        return {"known": False}
    return {"known": True, **node.facts()}


def fit_snapshot(snapshot: dict[str, Any]) -> dict[str, Any]:
    """``snapshot`` small enough for the report: node lists compressed, or only counted.

    The Advisor API refuses a ``state_before`` larger than 16 KiB as JSON
    (``recovery/audit/limits.py``, which this process does not load); a job on thousands of
    nodes would exceed it with its node list spelled out.
    """
    if _json_bytes(snapshot) <= MAX_SNAPSHOT_BYTES:
        return snapshot
    fitted = dict(snapshot)
    lists = {key: fitted[key] for key in NODE_LIST_KEYS if isinstance(fitted.get(key), list)}
    for key, names in lists.items():
        try:
            fitted[key] = compress_nodelist(names)
        except NodeListError:
            fitted[key] = f"{len(names)} nodes"
    if _json_bytes(fitted) > MAX_SNAPSHOT_BYTES:
        for key, names in lists.items():
            fitted[key] = f"{len(names)} nodes, too many to list"
    return fitted


def _json_bytes(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str).encode())


def identity_problem(recommendation: ReadyRecommendation, job: JobInfo) -> str | None:
    """Why ``job`` is not the job the recommendation was made for, or None when it is.

    Slurm hands job ids out again (after MaxJobId, or when its state was reset): the id alone
    may name another user's job. A requeue sets the submit time to the requeue's moment, so a
    later submit time fits only a job that was restarted since.
    """
    if not recommendation.user or recommendation.submit_time is None:
        return "the recommendation does not say whose job it is (no user or submit time)"
    if job.user != recommendation.user:
        return f"job {job.job_id} belongs to {job.user!r}, not {recommendation.user!r}"
    assert job.submit_time is not None and job.restart_count is not None  # checked as known
    drift = job.submit_time - recommendation.submit_time
    if abs(drift) <= SUBMIT_TIME_TOLERANCE:
        return None
    if drift > SUBMIT_TIME_TOLERANCE and job.restart_count > 0:
        return None
    return (
        f"job {job.job_id} was submitted at {job.submit_time.isoformat()}, not at "
        f"{recommendation.submit_time.isoformat()}: the id names another job now"
    )


def owner_problem(recommendation: ReadyRecommendation, job: JobInfo) -> str | None:
    """Why the job's owner, as its comment reads now, has not left this action to the loop.

    A job that is no longer opted in, or opted in to be observed only, is acted on only with an
    operator's approval: the owner may have changed the comment after the decision was made.
    """
    if recommendation.approved_by:
        return None
    if not job.opt_in.opted_in:
        return f"job {job.job_id} is no longer opted in ({job.opt_in.reason}) and nobody approved"
    if job.opt_in.mode != OptInMode.ACT:
        return f"job {job.job_id} is opted in to be observed only and nobody approved the action"
    return None
