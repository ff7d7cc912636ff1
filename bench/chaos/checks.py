"""The run's verdict: the simulator's journal (ground truth) against the control plane's records.

The simulator journals every scheduler command it received (who sent it, the job's attempt and
state at that moment, whether it took effect) and every failure it made happen. The checks:

- ``duplicate_actions``: a failure restarted or stopped more than once. Each effective restart
  (``requeue``/``requeuehold``) or stop (``scancel``) is charged to the job's latest failure
  before it; two charged to one failure are a duplicate.
- ``acted_on_healthy_attempt``: a restart or stop that reached an attempt that was running and
  had not failed: the action of an earlier failure landing on its successor.
- ``lost``: a failure of an opted-in job, before the schedule ended, that left no anomaly, no
  recommendation and no audit event on its attempt (an attempt Slurm started and requeued
  between two polls has a row of its own, made by the poll that saw the restart count jump).
- ``unfinished``: recommendations still claimed past their lease, or ready past their deadline.
- ``audit_gaps``: commands the simulator received with no ``dispatched`` event naming them
  (controllers and the watchdog write each command into the trail before running it), and
  commands reported as run (return code 0) that it never received.

These functions need Django set up on the run's database; the journal is plain data.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

RESTARTS = frozenset({"requeue", "requeuehold"})
# Straggling slows a job without interrupting it: the loop may rightly record it and do nothing.
NOT_INTERRUPTIONS = frozenset({"straggler"})


def command_verb(argv: list[str]) -> str:
    if argv and argv[0] == "scancel":
        return "scancel"
    if len(argv) > 1 and argv[0] == "scontrol":
        if argv[1] == "update":
            return "update:" + ",".join(part.split("=", 1)[0] for part in argv[3:])
        return argv[1]
    return " ".join(argv[:2])


def is_restart_or_stop(argv: list[str]) -> bool:
    verb = command_verb(argv)
    return verb in RESTARTS or verb == "scancel"


@dataclass
class ClusterVerdict:
    cluster: str
    journal: dict[str, Any] = field(default_factory=dict, repr=False)
    failures: int = 0
    failures_checked: int = 0
    commands: int = 0
    duplicate_actions: list[dict[str, Any]] = field(default_factory=list)
    acted_on_healthy_attempt: list[dict[str, Any]] = field(default_factory=list)
    lost: list[dict[str, Any]] = field(default_factory=list)
    unfinished: list[dict[str, Any]] = field(default_factory=list)
    unrecorded_commands: list[dict[str, Any]] = field(default_factory=list)
    phantom_commands: list[dict[str, Any]] = field(default_factory=list)
    recovery_times_s: list[float] = field(default_factory=list)
    accounted_by: Counter[str] = field(default_factory=Counter)


def charge_actions(journal: dict[str, Any], verdict: ClusterVerdict) -> None:
    """Duplicate actions and actions on healthy attempts, from the journal alone."""
    failures_by_job: dict[int, list[dict[str, Any]]] = {}
    for failure in journal["failures"]:
        failures_by_job.setdefault(int(failure["job_id"]), []).append(failure)
    for failures in failures_by_job.values():
        failures.sort(key=lambda failure: failure["at"])
    charged: dict[tuple[int, float], list[dict[str, Any]]] = {}
    for command in journal["commands"]:
        if not command.get("effective") or command.get("job_id") is None:
            continue
        if not is_restart_or_stop(command["argv"]):
            continue
        job_id = int(command["job_id"])
        before = [f for f in failures_by_job.get(job_id, []) if f["at"] <= command["at"]]
        if not before:
            verdict.acted_on_healthy_attempt.append({**command, "why": "the job never failed"})
            continue
        latest = before[-1]
        attempt_failed = any(f["attempt"] == command["attempt"] for f in before)
        if command.get("job_state") == "RUNNING" and not attempt_failed:
            verdict.acted_on_healthy_attempt.append(
                {**command, "why": f"attempt {command['attempt']} was running and had not failed"}
            )
        charged.setdefault((job_id, latest["at"]), []).append(command)
    for (job_id, at), commands in charged.items():
        if len(commands) > 1:
            verdict.duplicate_actions.append(
                {"job_id": job_id, "failure_at": at, "commands": commands}
            )


def recovery_times(journal: dict[str, Any]) -> list[float]:
    """Seconds from each failure to the first restart carried out for that job after it.

    A restart is carried out by a ``release`` (after a requeue in held state) or a plain
    ``requeue``; failures followed by neither (stopped, rejected, or restarted by Slurm alone)
    have no figure.
    """
    completions: dict[int, list[float]] = {}
    for command in journal["commands"]:
        carried_out = command_verb(command["argv"]) in {"release", "requeue"}
        if carried_out and command.get("effective") and command.get("job_id") is not None:
            completions.setdefault(int(command["job_id"]), []).append(command["at"])
    times = []
    for failure in journal["failures"]:
        if failure.get("effect") in NOT_INTERRUPTIONS:
            continue
        later = [at for at in completions.get(int(failure["job_id"]), []) if at >= failure["at"]]
        if later:
            times.append(min(later) - failure["at"])
    return times


def check_records(
    cluster_name: str,
    journal: dict[str, Any],
    *,
    failures_until: float,
    now: datetime,
    hang_detection_s: float = 0.0,
) -> ClusterVerdict:
    """Every check for one cluster: the journal against the database.

    A hang is found only once its silence has lasted the policy's hang timeout: one that began
    less than ``hang_detection_s`` before ``now`` could not have been recorded yet, and is not
    counted lost.
    """
    from recovery.choices import AuditKind, RecommendationStatus
    from recovery.models import Anomaly, AuditEvent, Cluster, Recommendation, Workload

    verdict = ClusterVerdict(cluster_name, journal)
    verdict.failures = len(journal["failures"])
    verdict.commands = len(journal["commands"])
    charge_actions(journal, verdict)
    verdict.recovery_times_s = recovery_times(journal)

    cluster = Cluster.objects.get(name=cluster_name)
    workloads = dict(Workload.objects.filter(cluster=cluster).values_list("job_id", "pk"))
    anomalies = set(
        Anomaly.objects.filter(workload__cluster=cluster).values_list(
            "workload_id", "attempt__number"
        )
    )
    recommended = set(
        Recommendation.objects.filter(workload__cluster=cluster).values_list(
            "workload_id", "attempt__number"
        )
    )
    about_failures = {
        AuditKind.DETECTED, AuditKind.CONFIRMED, AuditKind.STALLED, AuditKind.ATTRIBUTED,
        AuditKind.RECOMMENDED, AuditKind.WATCHDOG_RELEASED, AuditKind.STOPPED,
    }  # fmt: skip
    events = set(
        AuditEvent.objects.filter(cluster=cluster, kind__in=about_failures).values_list(
            "workload_id", "attempt"
        )
    )
    for failure in journal["failures"]:
        if failure["at"] > failures_until or failure.get("effect") in NOT_INTERRUPTIONS:
            continue
        if failure.get("effect") == "hang" and failure["at"] + hang_detection_s > now.timestamp():
            continue
        verdict.failures_checked += 1
        workload_id = workloads.get(str(failure["job_id"]))
        number = int(failure["attempt"]) + 1  # the control plane counts attempts from 1
        key = (workload_id, number)
        if workload_id is not None and key in anomalies:
            verdict.accounted_by["anomaly"] += 1
        elif workload_id is not None and key in recommended:
            verdict.accounted_by["recommendation"] += 1
        elif workload_id is not None and key in events:
            verdict.accounted_by["audit event"] += 1
        else:
            verdict.lost.append(
                {**failure, "workload": workload_id, "why": "no anomaly, recommendation or event"}
            )

    for row in Recommendation.objects.filter(
        workload__cluster=cluster,
        status__in=[RecommendationStatus.READY, RecommendationStatus.CLAIMED],
    ).values("pk", "status", "lease_owner", "lease_expires_at", "expires_at", "workload__job_id"):
        claimed_out = (
            row["status"] == RecommendationStatus.CLAIMED
            and row["lease_expires_at"] is not None
            and row["lease_expires_at"] < now
        )
        ready_out = (
            row["status"] == RecommendationStatus.READY
            and row["expires_at"] is not None
            and row["expires_at"] < now
        )
        if claimed_out or ready_out:
            verdict.unfinished.append({key: str(value) for key, value in row.items()})

    audit_gaps(cluster, journal, verdict)
    return verdict


def audit_gaps(cluster: Any, journal: dict[str, Any], verdict: ClusterVerdict) -> None:
    """Commands received without a record, and records of commands never received.

    Matched by their exact argv (which names the job), as multisets: the same command sent
    twice needs two records.
    """
    from recovery.choices import AuditKind
    from recovery.models import AuditEvent

    received: Counter[tuple[str, ...]] = Counter(
        tuple(command["argv"]) for command in journal["commands"]
    )
    dispatched: Counter[tuple[str, ...]] = Counter()
    claimed_run: Counter[tuple[str, ...]] = Counter()
    for kind, payload in AuditEvent.objects.filter(
        cluster=cluster,
        kind__in=[
            AuditKind.DISPATCHED, AuditKind.SCHEDULER_ACTION, AuditKind.ACTION_SKIPPED,
            AuditKind.ACTION_FAILED, AuditKind.ACTION_RETRY, AuditKind.REPORT_REFUSED,
            AuditKind.WATCHDOG_RELEASED,
        ],
    ).values_list("kind", "payload"):  # fmt: skip
        if kind == AuditKind.DISPATCHED:
            dispatched[tuple(payload.get("argv") or ())] += 1
            continue
        for command in payload.get("commands") or []:
            argv = tuple(command.get("argv") or ())
            if command.get("returncode") == 0:
                claimed_run[argv] += 1
    for argv, count in received.items():
        missing = count - dispatched[argv]
        if missing > 0:
            verdict.unrecorded_commands.append({"argv": list(argv), "missing": missing})
    for argv, count in claimed_run.items():
        extra = count - received[argv]
        if extra > 0:
            verdict.phantom_commands.append({"argv": list(argv), "extra": extra})


def percentile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(share * (len(ordered) - 1))))
    return ordered[index]


def summarise_times(values: list[float]) -> dict[str, Any]:
    return {
        "samples": len(values),
        "median": round(statistics.median(values), 2) if values else None,
        "p95": round(percentile(values, 0.95) or 0.0, 2) if values else None,
    }
