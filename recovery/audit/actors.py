"""Who an audit event says acted: the loop's own parts, and the people and programs outside it.

``AuditEvent.actor`` is a plain string so the trail can name anyone: the loop's parts are the
``Actor`` members, a controller is ``controller:<token name>``, a scheduler hook
``hook:<token name>``, a job pushing with its token ``job:<token name>``, an attribution verdict is
``attribution:<provider>``, and an operator is their user name. The values are stored and
filtered on as they are, so none of them may change. Django-free, like ``recovery.detection``.
"""

from __future__ import annotations

from enum import StrEnum

CONTROLLER_PREFIX = "controller:"
ATTRIBUTION_PREFIX = "attribution:"
HOOK_PREFIX = "hook:"
JOB_TOKEN_PREFIX = "job:"


class Actor(StrEnum):
    """The parts of the loop that write audit events on their own."""

    # Scheduler state changes, restarts allocated, training completed, jobs no longer listed,
    # job output files refused.
    POLLER = "poller"
    # Anomalies found in logs, kernel logs, metrics and scheduler state; progress and
    # checkpoints; crash confirmations.
    DETECTOR = "detector"
    # The attribution provider's health (degraded, recovered), not one anomaly's verdict.
    ATTRIBUTION = "attribution"
    # Recommendations made or held back, suspect nodes flagged.
    POLICY = "policy"
    # Holds released after their decision timeout, ready advice expired.
    WATCHDOG = "watchdog"
    # Claims handed back when their controller's lease ran out.
    LEASE_SWEEPER = "lease-sweeper"


def controller_actor(name: str) -> str:
    """The actor of a controller that uses the token named ``name``."""
    return f"{CONTROLLER_PREFIX}{name}"


def hook_actor(name: str) -> str:
    """The actor of a scheduler hook (epilog, strigger) that uses the hook token ``name``."""
    return f"{HOOK_PREFIX}{name}"


def job_token_actor(name: str) -> str:
    """The actor of a job that pushes with the job token ``name``."""
    return f"{JOB_TOKEN_PREFIX}{name}"


def attribution_actor(provider: str) -> str:
    """The actor of an attribution verdict made by ``provider`` (``builtin``, ``external``)."""
    return f"{ATTRIBUTION_PREFIX}{provider}"


def operator_actor(username: str) -> str:
    """The actor of a person's decision: their user name, as the trail has always shown it."""
    return username
