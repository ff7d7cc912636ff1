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
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from bench.chaos import schedule as faults

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
    recoveries: list[Recovery] = field(default_factory=list)
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


@dataclass(frozen=True)
class Recovery:
    """One failure and the restart that carried it out, with where the time went when the
    control plane's records say: until the recommendation was made (detection, decision), until
    a controller first claimed it, and the rest (acting, and any takeover)."""

    job_id: int
    attempt: int  # the simulator's, from 0
    failure_at: float
    done_at: float
    recommended_at: float | None = None
    claimed_at: float | None = None
    kind: str = ""  # the simulator's kind of failure

    @property
    def seconds(self) -> float:
        return self.done_at - self.failure_at

    def phases(self) -> dict[str, float]:
        if self.recommended_at is None or self.claimed_at is None:
            return {}
        return {
            "to_recommendation": max(0.0, self.recommended_at - self.failure_at),
            "to_claim": max(0.0, self.claimed_at - self.recommended_at),
            "to_restart": max(0.0, self.done_at - self.claimed_at),
        }


def recoveries(journal: dict[str, Any]) -> list[Recovery]:
    """Each failure with the first restart carried out for that job after it.

    A restart is carried out by a ``release`` (after a requeue in held state) or a plain
    ``requeue``, and belongs to the job's latest failure before it (as in ``charge_actions``);
    failures followed by neither before the job's next failure (stopped, rejected, or
    restarted by Slurm alone, whose next attempt then failed too) have no figure.
    """
    completions: dict[int, list[float]] = {}
    for command in journal["commands"]:
        carried_out = command_verb(command["argv"]) in {"release", "requeue"}
        if carried_out and command.get("effective") and command.get("job_id") is not None:
            completions.setdefault(int(command["job_id"]), []).append(command["at"])
    failures_at: dict[int, list[float]] = {}
    for failure in journal["failures"]:
        if failure.get("effect") not in NOT_INTERRUPTIONS:
            failures_at.setdefault(int(failure["job_id"]), []).append(failure["at"])
    found = []
    for failure in journal["failures"]:
        if failure.get("effect") in NOT_INTERRUPTIONS:
            continue
        job_id = int(failure["job_id"])
        next_failure = min(
            (at for at in failures_at[job_id] if at > failure["at"]), default=float("inf")
        )
        later = [at for at in completions.get(job_id, []) if failure["at"] <= at < next_failure]
        if later:
            found.append(
                Recovery(
                    job_id,
                    int(failure["attempt"]),
                    failure["at"],
                    min(later),
                    kind=str(failure.get("kind") or ""),
                )
            )
    return found


HANG = "hang"


def times_from_detectable(found: list[Recovery], hang_timeout_s: float) -> list[float]:
    """Each recovery's time from when its failure could be known: a hang only once it has
    lasted the policy's hang timeout (before, it is a quiet job like any other), everything
    else when it happened. What the control plane spent, the policy's patience left out."""
    return [
        max(0.0, recovery.seconds - (hang_timeout_s if recovery.kind == HANG else 0.0))
        for recovery in found
    ]


def recovery_times(journal: dict[str, Any]) -> list[float]:
    """Seconds from each failure to the first restart carried out for that job after it."""
    return [recovery.seconds for recovery in recoveries(journal)]


def with_phases(cluster: Any, found: list[Recovery]) -> list[Recovery]:
    """``found`` with when each failure's restart was recommended and first claimed, from the
    control plane's records (the recommendation for the failed attempt, its first claim)."""
    from recovery.choices import AuditKind, RecommendationAction
    from recovery.models import AuditEvent, Recommendation

    made: dict[tuple[str, int], tuple[int, float]] = {}
    for pk, job_id, number, created_at in (
        Recommendation.objects.filter(
            workload__cluster=cluster,
            action__in=[RecommendationAction.RESTART, RecommendationAction.RESTART_EXCLUDING],
        )
        .order_by("created_at", "pk")
        .values_list("pk", "workload__job_id", "attempt__number", "created_at")
    ):
        if number is not None:
            made.setdefault((str(job_id), int(number)), (pk, created_at.timestamp()))
    first_claims: dict[int, float] = {}
    for payload, at in (
        AuditEvent.objects.filter(cluster=cluster, kind=AuditKind.CLAIMED)
        .order_by("occurred_at")
        .values_list("payload", "occurred_at")
    ):
        first_claims.setdefault(int(payload.get("recommendation") or 0), at.timestamp())
    phased = []
    for recovery in found:
        # The control plane counts attempts from 1.
        recommendation = made.get((str(recovery.job_id), recovery.attempt + 1))
        claimed = first_claims.get(recommendation[0]) if recommendation else None
        phased.append(
            replace(recovery, recommended_at=recommendation[1], claimed_at=claimed)
            if recommendation is not None and claimed is not None and claimed <= recovery.done_at
            else recovery
        )
    return phased


@dataclass(frozen=True)
class Strike:
    """A fault as it landed: what it struck (a role, a service, a cluster's scheduler), when,
    and until when it kept that away (a process until its restart, a service until it was
    started again, a scheduler outage until it ended; an armed fault only at its command)."""

    kind: str
    at: float
    until: float
    target: str = ""


Intervals = list[tuple[float, float]]


def _merged(intervals: Intervals) -> Intervals:
    merged: Intervals = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _intersected(first: Intervals, second: Intervals) -> Intervals:
    return _merged(
        [
            (max(a, c), min(b, d))
            for a, b in _merged(first)
            for c, d in _merged(second)
            if max(a, c) < min(b, d)
        ]
    )


def _within(intervals: Intervals, start: float, end: float) -> float:
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in _merged(intervals))


def away_by_fault(strikes: list[Strike], cluster: str) -> dict[str, Intervals]:
    """When each kind of fault kept away something a restart on ``cluster`` needs: its
    scheduler, the web process, the database, the broker, beat, every worker at once, or every
    controller of the cluster at once (one left is enough; a kill and a pause of the two
    together are charged to both kinds)."""
    singles: dict[str, Callable[[str], bool]] = {
        faults.SCHEDULER_UNREACHABLE: lambda target: target == cluster,
        faults.KILL_WEB: lambda _: True,
        faults.KILL_BEAT: lambda _: True,
        faults.RESTART_MARIADB: lambda _: True,
        faults.RESTART_REDIS: lambda _: True,
    }
    away: dict[str, Intervals] = {
        kind: _merged([(s.at, s.until) for s in strikes if s.kind == kind and matches(s.target)])
        for kind, matches in singles.items()
    }
    groups: dict[tuple[str, ...], Callable[[str], bool]] = {
        (faults.KILL_WORKER,): lambda target: target.startswith("worker-"),
        (faults.KILL_CONTROLLER, faults.PAUSE_CONTROLLER): lambda target: target.startswith(
            f"controller-{cluster}-"
        ),
    }
    for kinds, member in groups.items():
        mine = [s for s in strikes if s.kind in kinds and member(s.target)]
        members = sorted({s.target for s in mine})
        every: Intervals | None = None
        for target in members:
            down = [(s.at, s.until) for s in mine if s.target == target]
            every = _merged(down) if every is None else _intersected(every, down)
        for kind in kinds:
            of_kind = [(s.at, s.until) for s in mine if s.kind == kind]
            away[kind] = _intersected(every or [], of_kind) if len(members) > 1 else []
    return away


def times_by_fault(
    found: list[Recovery], strikes: list[Strike], cluster: str
) -> dict[str, dict[str, Any]]:
    """What each kind of fault cost the recoveries of ``cluster``: the recoveries it struck
    (landed on, or kept its target away, between the failure and the restart) with their
    times, and the share of all recovery time during which it kept away something they needed
    (``away_by_fault``). Overlapping outages are each counted, so the shares add up to more than
    the whole; ``nothing_away`` is the time none was away, the control plane's own (polls,
    confirmations, leases lapsing after a controller died). Armed faults keep nothing away
    themselves: what they cost is the lease their controller's death leaves to lapse."""
    away = away_by_fault(strikes, cluster)
    total = sum(recovery.seconds for recovery in found) or 1.0
    split: dict[str, dict[str, Any]] = {}
    for kind in sorted({strike.kind for strike in strikes} | set(away)):
        own = [s for s in strikes if s.kind == kind and concerns(s, cluster)]
        struck = [
            recovery.seconds
            for recovery in found
            if any(s.at <= recovery.done_at and s.until >= recovery.failure_at for s in own)
        ]
        away_s = sum(_within(away.get(kind, []), r.failure_at, r.done_at) for r in found)
        split[kind] = {
            "struck": summarise_times(struck),
            "away_share": round(away_s / total, 3),
        }
    anything = _merged([interval for intervals in away.values() for interval in intervals])
    quiet = sum(r.seconds - _within(anything, r.failure_at, r.done_at) for r in found)
    split[NOTHING_AWAY] = {"struck": None, "away_share": round(quiet / total, 3)}
    return split


NOTHING_AWAY = "(nothing away)"


def times_scheduler_reachable(
    found: list[Recovery], strikes: list[Strike], cluster: str
) -> list[float]:
    """Each recovery's time less the time its cluster's scheduler was unreachable meanwhile:
    what the control plane spent, its own faults included. Nothing can read or restart a job
    while the scheduler does not answer, however the control plane is built."""
    outages = away_by_fault(strikes, cluster)[faults.SCHEDULER_UNREACHABLE]
    return [
        recovery.seconds - _within(outages, recovery.failure_at, recovery.done_at)
        for recovery in found
    ]


def concerns(strike: Strike, cluster: str) -> bool:
    """Whether ``strike`` hit ``cluster`` or what every cluster shares: not another cluster's
    scheduler or controllers."""
    if strike.target.startswith("controller-"):
        return strike.target.startswith(f"controller-{cluster}-")
    if strike.kind in {faults.SCHEDULER_UNREACHABLE, *faults.ARMED}:
        return strike.target == cluster
    return True


def summarise_phases(found: list[Recovery]) -> dict[str, Any]:
    """Median and p95 of each phase, over the recoveries whose phases are known."""
    phases = [recovery.phases() for recovery in found]
    known = [phase for phase in phases if phase]
    names = ("to_recommendation", "to_claim", "to_restart")
    return {name: summarise_times([phase[name] for phase in known]) for name in names}


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

    cluster = Cluster.objects.get(name=cluster_name)
    verdict.recoveries = with_phases(cluster, recoveries(journal))
    verdict.recovery_times_s = [recovery.seconds for recovery in verdict.recoveries]
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
