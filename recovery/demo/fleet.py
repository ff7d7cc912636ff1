"""Demo users and a demo fleet for trying the Console without a real cluster.

``seed_demo_cluster`` writes two simulated Slurm clusters with nodes, workloads, attempts,
anomalies with real-looking evidence, verdicts, recommendations in every interesting status and
a coherent audit trail per workload. It is idempotent: every row has a fixed identity (cluster
and job id, attempt number, anomaly fingerprint, recommendation idempotency key), and audit
events are only written together with the workload they belong to, because the trail is
append-only and can never be corrected afterwards.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.utils import timezone

from recovery import roles
from recovery.audit.record import record_event
from recovery.choices import (
    AnomalyKind,
    AttemptExitState,
    Attribution,
    AuditKind,
    ClusterMode,
    Connection,
    FailureCategory,
    NodeHealth,
    OptInMode,
    RecommendationAction,
    RecommendationStatus,
    SchedulerKind,
    Severity,
    WorkloadState,
)
from recovery.models import (
    Anomaly,
    Attempt,
    Cluster,
    Node,
    Recommendation,
    Verdict,
    Workload,
)
from recovery.read.insights import take_goodput_snapshots

DEMO_USERS: tuple[tuple[str, str, bool], ...] = (
    ("operator", roles.OPERATOR, False),
    ("viewer", roles.VIEWER, False),
    ("admin", roles.ADMIN, True),
)

A100_CLUSTER = "demo-a100"
H100_CLUSTER = "demo-h100"

DETECTOR = "detector"
ATTRIBUTOR = "attribution:builtin"
POLICY = "policy"
POLLER = "poller"
WATCHDOG = "watchdog"
OPERATOR = "operator"
ADMIN = "admin"
A100_CONTROLLER = "controller:slurm-advisor-1"
H100_CONTROLLER = "controller:slurm-advisor-2"
LEASE_SECONDS = 120
READY_TTL = timedelta(minutes=30)
GPUS_PER_NODE = 8


def ensure_demo_users(password: str) -> list[str]:
    """Create or update the demo users ``operator``, ``viewer`` and ``admin``.

    Each ends up in exactly its role's group with ``password``; ``admin`` may also use the
    Django admin (staff) without being a superuser. Returns the user names.
    """
    if not password:
        raise ValueError("a demo password must not be empty")
    user_model = get_user_model()
    usernames: list[str] = []
    with transaction.atomic():
        for username, group_name, staff in DEMO_USERS:
            try:
                group = Group.objects.get(name=group_name)
            except Group.DoesNotExist:
                raise RuntimeError(
                    f"the group {group_name!r} is missing: run `manage.py migrate` first"
                ) from None
            user, _ = user_model.objects.get_or_create(username=username)
            user.set_password(password)
            user.is_active = True
            user.is_staff = staff
            user.is_superuser = False
            user.save()
            user.groups.set([group])
            usernames.append(username)
    return usernames


@dataclass
class SeedSummary:
    """How many rows one run of ``seed_demo_cluster`` created (zero everywhere on a re-run)."""

    clusters: int = 0
    nodes: int = 0
    workloads: int = 0
    attempts: int = 0
    anomalies: int = 0
    verdicts: int = 0
    recommendations: int = 0
    events: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @property
    def total(self) -> int:
        return sum(self.as_dict().values())


def seed_demo_cluster(now: datetime | None = None, seed: int = 7) -> SeedSummary:
    """Write the demo clusters ``demo-a100`` (monitor mode) and ``demo-h100`` (action mode).

    ``now`` anchors every time (default: the current time); ``seed`` drives the small
    variations (detection latencies, process ids, sequence numbers). Rows that already exist
    are left as they are.
    """
    anchor = (now or timezone.now()).replace(microsecond=0)
    builder = _Builder(anchor, random.Random(seed))
    _seed_a100(builder)
    _seed_h100(builder)
    take_goodput_snapshots(anchor)  # so the Insights page has figures before the worker runs
    return builder.summary


# --- building blocks -------------------------------------------------------------------------


def _node_names(prefix: str, numbers: Iterable[int]) -> list[str]:
    return [f"{prefix}-{number:03d}" for number in numbers]


def a100(*numbers: int) -> list[str]:
    return _node_names("gpu-a100", numbers)


def h100(*numbers: int) -> list[str]:
    return _node_names("gpu-h100", numbers)


def hostlist(names: Sequence[str]) -> str:
    """Slurm's compressed form: ``gpu-a100-[001-006,008]``."""
    groups: dict[str, list[str]] = {}
    for name in names:
        prefix, _, number = name.rpartition("-")
        groups.setdefault(prefix, []).append(number)
    parts = []
    for prefix, numbers in groups.items():
        width = len(numbers[0])
        values = sorted(int(n) for n in numbers)
        ranges: list[tuple[int, int]] = []
        first = last = values[0]
        for value in values[1:]:
            if value == last + 1:
                last = value
                continue
            ranges.append((first, last))
            first = last = value
        ranges.append((first, last))
        text = ",".join(
            f"{a:0{width}d}" if a == b else f"{a:0{width}d}-{b:0{width}d}" for a, b in ranges
        )
        parts.append(f"{prefix}-{text}" if len(values) == 1 else f"{prefix}-[{text}]")
    return ",".join(parts)


def _fingerprint(*parts: object) -> str:
    return hashlib.sha256("|".join(str(p) for p in parts).encode()).hexdigest()[:40]


def _slurm_time(at: datetime) -> str:
    return f"{at:%Y-%m-%dT%H:%M:%S}"


def _log_time(at: datetime) -> str:
    return f"{at:%Y-%m-%d %H:%M:%S}"


@dataclass(frozen=True)
class _Pace:
    """How a training run advances: ``step_seconds`` a step and a checkpoint every ``every``
    steps, written to ``path(step)`` ``save_seconds`` after that step."""

    step_seconds: float
    every: int
    path: Callable[[int], str]
    save_seconds: int = 40


@dataclass(frozen=True)
class _Run:
    """One attempt as a story tells it: its number, its nodes, when it started, and the nodes
    kept out of it."""

    number: int
    nodes: Sequence[str]
    started_at: datetime
    excluded: Sequence[str] = ()


@dataclass(frozen=True)
class _Progress:
    """How far ``run`` got: its last step, its last checkpoint (and whether it saved one
    itself); with the step it began at and its ``pace``, so that a restart can resume it."""

    run: _Run
    pace: _Pace
    start_step: int
    step: int
    at: datetime
    checkpoint_step: int | None
    checkpoint_at: datetime | None
    saved: bool


@dataclass(frozen=True)
class _NodeSpec:
    state: str = "IDLE"
    reason: str = ""
    health: str = NodeHealth.HEALTHY
    times_implicated: int = 0
    implicated_hours_ago: float | None = None
    excluded_hours: int = 0


class _Builder:
    def __init__(self, now: datetime, rng: random.Random) -> None:
        self.now = now
        self.rng = rng
        self.summary = SeedSummary()

    def ago(self, hours: float = 0, minutes: float = 0, seconds: float = 0) -> datetime:
        return self.now - timedelta(hours=hours, minutes=minutes, seconds=seconds)

    def latency(self) -> timedelta:
        return timedelta(seconds=self.rng.randint(3, 9))

    def cluster(self, name: str, **defaults: Any) -> Cluster:
        cluster, created = Cluster.objects.get_or_create(
            name=name, defaults={**defaults, "last_polled_at": self.now}
        )
        self.summary.clusters += created
        return cluster

    def nodes(self, cluster: Cluster, names: Sequence[str], specs: dict[str, _NodeSpec]) -> None:
        for name in names:
            spec = specs.get(name, _NodeSpec())
            implicated_at = (
                self.ago(hours=spec.implicated_hours_ago)
                if spec.implicated_hours_ago is not None
                else None
            )
            excluded_until = (
                implicated_at + timedelta(hours=spec.excluded_hours)
                if implicated_at is not None and spec.excluded_hours
                else None
            )
            _, created = Node.objects.get_or_create(
                cluster=cluster,
                name=name,
                defaults={
                    "scheduler_state": spec.state,
                    "state_reason": spec.reason,
                    "health": spec.health,
                    "times_implicated": spec.times_implicated,
                    "last_implicated_at": implicated_at,
                    "excluded_until": excluded_until,
                },
            )
            self.summary.nodes += created

    def story(
        self, cluster: Cluster, job_id: str, build: Callable[[_Story], None], **fields: Any
    ) -> None:
        """Write one workload and everything under it in one transaction."""
        with transaction.atomic():
            workload, created = Workload.objects.get_or_create(
                cluster=cluster, job_id=job_id, defaults=fields
            )
            self.summary.workloads += created
            story = _Story(self, workload, created)
            build(story)
            story.flush()


class _Story:
    """Children and audit trail of one workload; events are written only for a new workload."""

    def __init__(self, builder: _Builder, workload: Workload, created: bool) -> None:
        self.b = builder
        self.rng = builder.rng
        self.workload = workload
        self.cluster = workload.cluster
        self.created = created
        self.controller = H100_CONTROLLER if self.cluster.name == H100_CLUSTER else A100_CONTROLLER
        self._events: list[tuple[datetime, int, dict[str, Any]]] = []
        self._final: dict[str, Any] = {}

    @property
    def job(self) -> str:
        return self.workload.job_id

    # events

    def event(
        self, kind: str, actor: str, at: datetime, attempt: int | None = None, /, **payload: Any
    ) -> None:
        if not self.created:
            return
        self._events.append(
            (
                at,
                len(self._events),
                {"kind": kind, "actor": actor, "attempt": attempt, "payload": payload},
            )
        )

    def state(
        self,
        at: datetime,
        attempt: int | None,
        old: str,
        new: str,
        scheduler_state: str,
        **extra: Any,
    ) -> None:
        self.event(
            AuditKind.STATE_CHANGED,
            POLLER,
            at,
            attempt,
            **{"from": old, "to": new, "scheduler_state": scheduler_state, **extra},
        )

    def finish(
        self, state: str, attempt: int, progress: _Progress | None = None, reason: str = ""
    ) -> None:
        """Final workload state, current attempt and progress, set on a new workload only."""
        self._final = {"state": state}
        if reason:
            self._final["state_reason"] = reason
        self._final["current_attempt"] = attempt
        if progress is not None:
            self._final.update(
                last_progress_step=progress.step,
                last_progress_at=progress.at,
                last_checkpoint_step=progress.checkpoint_step,
                last_checkpoint_at=progress.checkpoint_at,
            )

    def flush(self) -> None:
        if not self.created:
            return
        if self._final:
            for name, value in self._final.items():
                setattr(self.workload, name, value)
            self.workload.save(update_fields=[*self._final, "updated_at"])
        for at, _, event in sorted(self._events, key=lambda item: (item[0], item[1])):
            record_event(cluster=self.cluster, workload=self.workload, occurred_at=at, **event)
            self.b.summary.events += 1

    # attempts and training progress

    def start(self, nodes: Sequence[str], after_submit: timedelta) -> _Run:
        """The first attempt starts running on ``nodes``, ``after_submit`` the submission."""
        at = self.workload.submit_time + after_submit
        self.state(at, 1, "pending", "running", "RUNNING", nodes=hostlist(nodes))
        return _Run(1, nodes, at)

    def end_attempt(
        self,
        run: _Run,
        ended_at: datetime,
        exit_state: str,
        *,
        exit_code: int | None = None,
        progress: _Progress | None = None,
        noticed_after: timedelta | None = None,
        pending_reason: str = "",
    ) -> Attempt:
        """``run`` ended at ``ended_at``; ``noticed_after`` that, the poller sees the job failed
        in the Slurm state of the same name (or, if requeued, pending for ``pending_reason``)."""
        attempt = self.attempt(
            run.number,
            run.nodes,
            run.started_at,
            ended_at=ended_at,
            exit_state=exit_state,
            exit_code=exit_code,
            excluded=run.excluded,
            produced_checkpoint=progress is not None and progress.saved,
        )
        if noticed_after is not None:
            at = ended_at + noticed_after
            if exit_state == AttemptExitState.REQUEUED:
                self.state(at, run.number, "running", "requeued", "PENDING", reason=pending_reason)
            else:
                self.state(at, run.number, "running", "failed", exit_state.upper())
        return attempt

    def restart(
        self,
        number: int,
        nodes: Sequence[str],
        at: datetime,
        *,
        recommendation: Recommendation | None = None,
        excluded: Sequence[str] = (),
        requeued_by: str = "",
        was: str = "failed",
    ) -> _Run:
        """Attempt ``number`` is allocated ``nodes`` at ``at``, carrying out ``recommendation``
        or requeued by ``requeued_by``."""
        self.state(at, number, was, "running", "RUNNING", nodes=hostlist(nodes))
        allocation: dict[str, Any] = {}
        if recommendation is not None:
            allocation["recommendation"] = recommendation.pk
        allocation["nodes"] = list(nodes)
        if excluded:
            allocation["excluded_nodes"] = list(excluded)
        if requeued_by:
            allocation["requeued_by"] = requeued_by
        self.event(AuditKind.RESTART_ALLOCATED, POLLER, at, number, **allocation)
        return _Run(number, nodes, at, excluded)

    def resume(
        self,
        run: _Run,
        after: _Progress,
        *,
        warm_up: timedelta,
        until: datetime | None = None,
        to_step: int | None = None,
    ) -> _Progress:
        """``warm_up`` after ``run`` starts, the training of ``after`` goes on at its pace from
        its last checkpoint (with none, from where that earlier run began)."""
        checkpoint = (
            after.checkpoint_step or after.start_step,
            after.checkpoint_at or after.run.started_at,
        )
        return self.train(
            run,
            after.pace,
            start_step=checkpoint[0],
            start=run.started_at + warm_up,
            until=until,
            to_step=to_step,
            checkpoint=checkpoint,
            resumed=True,
        )

    def keep_running(self, progress: _Progress) -> Attempt:
        """The run of ``progress`` is still going, and so is the workload."""
        run = progress.run
        attempt = self.attempt(
            run.number,
            run.nodes,
            run.started_at,
            excluded=run.excluded,
            produced_checkpoint=progress.saved,
        )
        self.finish(WorkloadState.RUNNING, run.number, progress)
        return attempt

    def complete(
        self, progress: _Progress, *, ended_after: timedelta, noticed_after: timedelta
    ) -> None:
        """The run of ``progress`` exits 0 ``ended_after`` its last step and the workload is
        done; the poller sees it ``noticed_after`` that."""
        run = progress.run
        end = progress.at + ended_after
        self.attempt(
            run.number,
            run.nodes,
            run.started_at,
            ended_at=end,
            exit_state=AttemptExitState.COMPLETED,
            exit_code=0,
            excluded=run.excluded,
            produced_checkpoint=progress.saved,
        )
        self.event(
            AuditKind.TRAINING_COMPLETED,
            POLLER,
            end,
            run.number,
            exit_code=0,
            final_step=progress.step,
        )
        self.state(end + noticed_after, run.number, "running", "completed", "COMPLETED")
        self.finish(WorkloadState.COMPLETED, run.number, progress, reason="COMPLETED (exit code 0)")

    def attempt(
        self,
        number: int,
        nodes: Sequence[str],
        started_at: datetime,
        *,
        ended_at: datetime | None = None,
        exit_state: str = AttemptExitState.RUNNING,
        exit_code: int | None = None,
        excluded: Sequence[str] = (),
        produced_checkpoint: bool = False,
    ) -> Attempt:
        attempt, created = Attempt.objects.get_or_create(
            workload=self.workload,
            number=number,
            defaults={
                "nodes": list(nodes),
                "excluded_nodes": list(excluded),
                "started_at": started_at,
                "ended_at": ended_at,
                "exit_state": exit_state,
                "exit_code": exit_code,
                "produced_checkpoint": produced_checkpoint,
            },
        )
        self.b.summary.attempts += created
        return attempt

    def train(
        self,
        run: _Run,
        pace: _Pace,
        *,
        start: datetime,
        start_step: int = 0,
        until: datetime | None = None,
        to_step: int | None = None,
        checkpoint: tuple[int, datetime] | None = None,
        resumed: bool = False,
    ) -> _Progress:
        """Steps of ``run`` from ``start_step`` at ``start``, at ``pace``.

        Runs until the time ``until`` or up to the step ``to_step``; emits the
        checkpoint_saved events (and progress_resumed for a restart) on the way.
        """
        attempt = run.number
        step_seconds, every, save_seconds = pace.step_seconds, pace.every, pace.save_seconds
        if to_step is not None:
            end_step = to_step
        elif until is not None:
            end_step = start_step + int((until - start).total_seconds() // step_seconds)
        else:
            raise ValueError("give until or to_step")
        last_at = start + timedelta(seconds=round((end_step - start_step) * step_seconds))
        checkpoint_step, checkpoint_at = checkpoint or (None, None)
        saved = False
        if resumed:
            self.event(
                AuditKind.PROGRESS_RESUMED,
                DETECTOR,
                start + timedelta(seconds=round(step_seconds)),
                attempt,
                step=start_step + 1,
                from_checkpoint=checkpoint_step,
            )
        first = (start_step // every + 1) * every
        for step in range(first, end_step + 1, every):
            at = start + timedelta(seconds=round((step - start_step) * step_seconds) + save_seconds)
            if until is not None and at > until:
                break
            self.event(
                AuditKind.CHECKPOINT_SAVED, DETECTOR, at, attempt, step=step, path=pace.path(step)
            )
            checkpoint_step, checkpoint_at, saved = step, at, True
        return _Progress(
            run, pace, start_step, end_step, last_at, checkpoint_step, checkpoint_at, saved
        )

    # findings

    def anomaly(
        self,
        attempt: Attempt,
        *,
        key: str,
        category: str,
        attribution: str,
        confidence: float,
        signature: str,
        evidence_line: str,
        excerpt: Sequence[str],
        evidence_at: datetime,
        kind: str = AnomalyKind.CRASH,
        severity: str = Severity.ERROR,
        nodes: Sequence[str] = (),
        ranks: Sequence[int] = (),
        occurrences: int = 1,
        details: dict[str, Any] | None = None,
        rule: str = "",
        earlier_verdict: tuple[str, float, str] | None = None,
    ) -> Anomaly:
        """One finding, its built-in verdict(s), and the detected/attributed events.

        ``earlier_verdict`` (attribution, confidence, rule) is a first verdict that more
        evidence later changed to ``attribution``.
        """
        detected_at = evidence_at + self.b.latency()
        anomaly, created = Anomaly.objects.get_or_create(
            workload=self.workload,
            attempt=attempt,
            fingerprint=_fingerprint("demo", self.cluster.name, self.job, attempt.number, key),
            defaults={
                "kind": kind,
                "category": category,
                "attribution": attribution,
                "severity": severity,
                "signature": signature,
                "evidence_line": evidence_line,
                "evidence_excerpt": "\n".join(excerpt),
                "implicated_nodes": list(nodes),
                "implicated_ranks": list(ranks),
                "occurrences": occurrences,
                "details": details or {},
                "evidence_at": evidence_at,
                "detected_at": detected_at,
            },
        )
        self.b.summary.anomalies += created
        if not created:
            return anomaly
        self.event(
            AuditKind.DETECTED,
            DETECTOR,
            anomaly.detected_at,
            attempt.number,
            anomaly=anomaly.pk,
            kind=kind,
            category=category,
            signature=signature,
            line=evidence_line,
            occurrences=occurrences,
            nodes=list(nodes),
            ranks=_rank_text(ranks),
            evidence_at=evidence_at.isoformat(),
        )
        verdicts: list[tuple[str, float, str, datetime]] = []
        if earlier_verdict is not None:
            verdicts.append((*earlier_verdict, anomaly.detected_at + timedelta(seconds=1)))
            verdicts.append(
                (attribution, confidence, rule, anomaly.detected_at + timedelta(seconds=2))
            )
        else:
            verdicts.append((attribution, confidence, rule, anomaly.detected_at))
        for verdict_attribution, verdict_confidence, verdict_rule, at in verdicts:
            implicated = list(nodes) if verdict_attribution == Attribution.HARDWARE else []
            if details and verdict_attribution == Attribution.HARDWARE:
                implicated = details.get("culprit_nodes", implicated)
            Verdict.objects.create(
                anomaly=anomaly,
                provider=Verdict.BUILTIN_PROVIDER,
                attribution=verdict_attribution,
                confidence=verdict_confidence,
                implicated_nodes=implicated,
                detail={"rule": verdict_rule, "provider_available": False},
                created_at=at,
            )
            self.b.summary.verdicts += 1
            self.event(
                AuditKind.ATTRIBUTED,
                ATTRIBUTOR,
                at,
                attempt.number,
                anomaly=anomaly.pk,
                attribution=verdict_attribution,
                confidence=verdict_confidence,
                provider=Verdict.BUILTIN_PROVIDER,
                rule=verdict_rule,
                implicated_nodes=implicated,
                degraded="no external attribution provider configured; built-in rules only",
            )
        return anomaly

    # recommendations

    def recommend(
        self,
        n: int,
        attempt: Attempt,
        anomaly: Anomaly | None,
        *,
        action: str,
        reason: str,
        status: str,
        at: datetime | None = None,
        excluded: Sequence[str] = (),
        decided_by: str = "",
        decided_at: datetime | None = None,
        note: str = "",
        state_before: str = "FAILED",
        skipped_reason: str = "",
    ) -> Recommendation:
        """A recommendation and the events of its way to ``status``.

        Made at ``at``, by default two seconds after ``anomaly`` was detected. Monitor mode:
        recommended, then approved or rejected by ``decided_by``; action mode: ready at once.
        Executed and skipped ones are dispatched, claimed by the controller and carried out (or
        found already done).
        """
        if at is None:
            if anomaly is None:
                raise ValueError("a recommendation without an anomaly needs at")
            at = anomaly.detected_at + timedelta(seconds=2)
        monitor = self.cluster.mode == ClusterMode.MONITOR
        excluded = list(excluded)
        key = f"demo:{self.cluster.name}:{self.job}:{attempt.number}:{n}"
        fields: dict[str, Any] = {
            "workload": self.workload,
            "attempt": attempt,
            "anomaly": anomaly,
            "action": action,
            "excluded_nodes": excluded,
            "reason": reason,
            "status": status,
            "created_at": at,
        }
        approved = status in {
            RecommendationStatus.READY,
            RecommendationStatus.CLAIMED,
            RecommendationStatus.EXECUTED,
            RecommendationStatus.SKIPPED,
            RecommendationStatus.EXPIRED,
        }
        ready_at: datetime | None = None
        if monitor and (approved or status == RecommendationStatus.REJECTED):
            if decided_at is None:
                raise ValueError("a decided recommendation needs decided_at")
            fields.update(decided_by=decided_by or OPERATOR, decided_at=decided_at)
            fields["decision_note"] = note
            ready_at = decided_at if approved else None
        elif approved:
            ready_at = at + timedelta(seconds=1)
        if ready_at is not None:
            fields["expires_at"] = ready_at + READY_TTL
        commands = _commands(action, self.job, excluded)
        claim_at = (ready_at or at) + timedelta(seconds=self.rng.randint(2, 6))
        done_at = claim_at + timedelta(seconds=len(commands) + 1)
        if status in {RecommendationStatus.EXECUTED, RecommendationStatus.SKIPPED}:
            fields.update(
                lease_owner=self.controller,
                lease_expires_at=claim_at + timedelta(seconds=LEASE_SECONDS),
            )
            if status == RecommendationStatus.EXECUTED:
                fields["result"] = {
                    "scheduler_state_before": state_before,
                    "commands": [
                        {"command": command, "returncode": 0, "stdout": "", "stderr": ""}
                        for command in commands
                    ],
                    "finished_at": done_at.isoformat(),
                }
            else:
                fields["result"] = {"skipped": skipped_reason, "scheduler_state": state_before}
        recommendation, created = Recommendation.objects.get_or_create(
            idempotency_key=key, defaults=fields
        )
        self.b.summary.recommendations += created
        if not created:
            return recommendation
        pk = recommendation.pk
        self.event(
            AuditKind.RECOMMENDED,
            POLICY,
            at,
            attempt.number,
            recommendation=pk,
            anomaly=anomaly.pk if anomaly else None,
            action=action,
            excluded_nodes=excluded,
            reason=reason,
            mode=self.cluster.mode,
            would_have_done=monitor,
        )
        if monitor and decided_at is not None and fields.get("decided_by"):
            self.event(
                AuditKind.APPROVED if approved else AuditKind.REJECTED,
                fields["decided_by"],
                decided_at,
                attempt.number,
                recommendation=pk,
                action=action,
                excluded_nodes=excluded,
                note=note,
            )
        if ready_at is not None:
            self.event(
                AuditKind.DISPATCHED,
                POLICY,
                ready_at,
                attempt.number,
                recommendation=pk,
                action=action,
                excluded_nodes=excluded,
                expires_at=(ready_at + READY_TTL).isoformat(),
            )
        if status not in {RecommendationStatus.EXECUTED, RecommendationStatus.SKIPPED}:
            return recommendation
        self.event(
            AuditKind.CLAIMED,
            self.controller,
            claim_at,
            attempt.number,
            recommendation=pk,
            lease_seconds=LEASE_SECONDS,
        )
        if status == RecommendationStatus.SKIPPED:
            self.event(
                AuditKind.ACTION_SKIPPED,
                self.controller,
                claim_at + timedelta(seconds=1),
                attempt.number,
                recommendation=pk,
                action=action,
                scheduler_state=state_before,
                reason=skipped_reason,
            )
            return recommendation
        for offset, command in enumerate(commands, start=1):
            self.event(
                AuditKind.SCHEDULER_ACTION,
                self.controller,
                claim_at + timedelta(seconds=offset),
                attempt.number,
                recommendation=pk,
                command=command,
                returncode=0,
                duration_ms=self.rng.randint(40, 400),
            )
        if action == RecommendationAction.STOP:
            self.event(
                AuditKind.STOPPED,
                self.controller,
                done_at,
                attempt.number,
                recommendation=pk,
                reason=reason,
            )
        return recommendation

    def supersede(
        self, old: Recommendation, new: Recommendation, at: datetime, attempt: int
    ) -> None:
        if old.superseded_by_id is None and old.status == RecommendationStatus.SUPERSEDED:
            old.superseded_by = new
            old.save(update_fields=["superseded_by", "updated_at"])
        self.event(
            AuditKind.SUPERSEDED,
            POLICY,
            at,
            attempt,
            recommendation=old.pk,
            superseded_by=new.pk,
            reason="a newer recommendation replaces it",
        )


def _commands(action: str, job_id: str, excluded: Sequence[str]) -> list[str]:
    if action == RecommendationAction.RESTART:
        return [f"scontrol requeue {job_id}"]
    if action == RecommendationAction.RESTART_EXCLUDING:
        return [
            f"scontrol requeuehold {job_id}",
            f"scontrol update JobId={job_id} ExcNodeList={','.join(excluded)}",
            f"scontrol release {job_id}",
        ]
    if action == RecommendationAction.STOP:
        return [f"scancel {job_id}"]
    return []


def _rank_text(ranks: Sequence[int]) -> str:
    if not ranks:
        return ""
    values = sorted(ranks)
    ranges: list[str] = []
    first = last = values[0]
    for value in values[1:]:
        if value == last + 1:
            last = value
            continue
        ranges.append(str(first) if first == last else f"{first}-{last}")
        first = last = value
    ranges.append(str(first) if first == last else f"{first}-{last}")
    return ",".join(ranges)


def _opt_in(mode: str) -> dict[str, Any]:
    return {
        "opted_in": True,
        "opt_in_settings": {"environment": "prod", "mode": mode},
        "environment": "prod",
        "opt_in_mode": mode,
    }


def _megatron_ckpt(base: str) -> Callable[[int], str]:
    return lambda step: f"{base}/iter_{step:07d}"


def _deepspeed_ckpt(base: str) -> Callable[[int], str]:
    return lambda step: f"{base}/global_step{step}"


def _hf_ckpt(base: str) -> Callable[[int], str]:
    return lambda step: f"{base}/checkpoint-{step}"


# --- demo-a100: monitor mode ----------------------------------------------------------------

A100_NODES = a100(*range(1, 17))


def _seed_a100(b: _Builder) -> None:
    cluster = b.cluster(
        A100_CLUSTER,
        scheduler_kind=SchedulerKind.SIMULATED,
        connection=Connection.SIMULATED,
        mode=ClusterMode.MONITOR,
        acknowledge_scheduler_actions=False,
        environment="prod",
        connection_settings={"recorded": {"nodes": hostlist(A100_NODES), "gpus_per_node": 8}},
    )
    allocated = {*a100(1, 2, 3, 4, 5, 6, 8, 9), *a100(12, 13), *a100(15, 16)}
    specs = {
        name: _NodeSpec(state="ALLOCATED" if name in allocated else "IDLE") for name in A100_NODES
    }
    specs[a100(7)[0]] = _NodeSpec(
        state="DRAINED",
        reason="Xid 79 GPU fell off the bus",
        health=NodeHealth.UNHEALTHY,
        times_implicated=1,
        implicated_hours_ago=10.2,
        excluded_hours=24,
    )
    specs[a100(12)[0]] = _NodeSpec(
        state="ALLOCATED",
        health=NodeHealth.SUSPECT,
        times_implicated=1,
        implicated_hours_ago=0.6,
    )
    specs[a100(14)[0]] = _NodeSpec(
        state="IDLE",
        health=NodeHealth.SUSPECT,
        times_implicated=1,
        implicated_hours_ago=1.6,
    )
    b.nodes(cluster, A100_NODES, specs)

    observe = _opt_in(OptInMode.OBSERVE)
    b.story(
        cluster,
        "48188",
        _llama70b_first,
        name="llama-70b-pretrain",
        user="mchen",
        partition="gpu-long",
        workflow_id="llama-70b-pretrain-v3",
        submit_time=b.ago(hours=47, minutes=36),
        **observe,
    )
    b.story(
        cluster,
        "48191",
        _whisper,
        name="whisper-large-v3-distill",
        user="apatel",
        partition="gpu",
        submit_time=b.ago(hours=44, minutes=6),
        **observe,
    )
    b.story(
        cluster,
        "48198",
        _deepseek_ib,
        name="deepseek-moe-16b-pretrain",
        user="lwang",
        partition="gpu-long",
        submit_time=b.ago(hours=38, minutes=14),
        **observe,
    )
    b.story(
        cluster,
        "48201",
        _llama13b_nan,
        name="llama-13b-math-cpt",
        user="jnovak",
        partition="gpu",
        workflow_id="math-cpt-sweep-07",
        submit_time=b.ago(hours=34, minutes=2),
        **observe,
    )
    b.story(
        cluster,
        "48205",
        _neox_storage,
        name="gpt-neox-20b-finetune",
        user="skumar",
        partition="gpu",
        submit_time=b.ago(hours=30, minutes=3),
        **observe,
    )
    b.story(
        cluster,
        "48209",
        _mistral_oom,
        name="mistral-7b-sft-32k",
        user="emartin",
        partition="gpu",
        submit_time=b.ago(hours=27, minutes=1),
        **observe,
    )
    b.story(
        cluster,
        "48213",
        _llama70b_xid,
        name="llama-70b-pretrain",
        user="mchen",
        partition="gpu-long",
        workflow_id="llama-70b-pretrain-v3",
        submit_time=b.ago(hours=23, minutes=34),
        **observe,
    )
    b.story(
        cluster,
        "48216",
        _sdxl_healthy,
        name="sdxl-finetune-product-shots",
        user="tnguyen",
        partition="gpu",
        submit_time=b.ago(hours=20, minutes=1),
        **observe,
    )
    b.story(
        cluster,
        "48221",
        _mixtral_straggler,
        name="mixtral-8x7b-sft",
        user="fsilva",
        partition="gpu",
        workflow_id="mixtral-sft-r4",
        submit_time=b.ago(hours=14, minutes=2),
        **observe,
    )
    b.story(
        cluster,
        "48224",
        _qwen_illegal_access,
        name="qwen2-72b-sft",
        user="ychoi",
        partition="gpu",
        submit_time=b.ago(hours=9, minutes=4),
        **observe,
    )
    b.story(
        cluster,
        "48230",
        _vit_hang,
        name="vit-h-14-clip",
        user="okoval",
        partition="gpu",
        submit_time=b.ago(hours=4, minutes=1),
        **observe,
    )
    b.story(
        cluster,
        "48233",
        _bert_keyerror,
        name="bert-large-mlm-ablation",
        user="rkim",
        partition="gpu",
        submit_time=b.ago(hours=3, minutes=8),
        **observe,
    )
    b.story(
        cluster,
        "48236",
        _not_opted_in,
        name="llama-8b-dpo",
        user="dpark",
        partition="gpu",
        submit_time=b.ago(minutes=41),
        opted_in=False,
        opt_in_error=(
            "job comment is not valid JSON: Expecting property name enclosed in double "
            "quotes: line 1 column 2 (char 1)"
        ),
    )


LLAMA70B_STEP = 9.6
LLAMA70B_EVERY = 500
LLAMA70B_PACE = _Pace(
    LLAMA70B_STEP, LLAMA70B_EVERY, _megatron_ckpt("/lustre/ckpt/llama-70b-pretrain-v3")
)


def _llama70b_first(s: _Story) -> None:
    """48188: a full 24 h allocation that ends at the time limit; the workflow goes on."""
    run = s.start(a100(*range(1, 9)), timedelta(minutes=2, seconds=11))
    end = run.started_at + timedelta(hours=24)
    progress = s.train(run, LLAMA70B_PACE, start=run.started_at + timedelta(minutes=6), until=end)
    attempt = s.end_attempt(
        run,
        end + timedelta(seconds=2),
        AttemptExitState.TIMEOUT,
        progress=progress,
        noticed_after=timedelta(seconds=38),
    )
    line = (
        f"slurmstepd: error: *** JOB {s.job} ON gpu-a100-001 CANCELLED AT "
        f"{_slurm_time(end)} DUE TO TIME LIMIT ***"
    )
    s.anomaly(
        attempt,
        key="time-limit",
        category=FailureCategory.SCHEDULER_EVENT,
        attribution=Attribution.APPLICATION,
        confidence=0.9,
        severity=Severity.WARNING,
        signature="slurm_time_limit",
        evidence_line=line,
        excerpt=[
            f" [{_log_time(end - timedelta(seconds=10))}] iteration     {progress.step}/  "
            "250000 | consumed samples:      "
            f"{progress.step * 1024} | elapsed time per iteration (ms): 9601.4 | learning rate: "
            "2.998E-04 | global batch size:  1024 | lm loss: 2.187731E+00 | loss scale: 1.0 | "
            "grad norm: 0.212 | number of skipped iterations:   0 | number of nan "
            "iterations:   0 |",
            line,
            "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.",
            "[rank0]: Received SIGTERM: 15",
        ],
        evidence_at=end,
        nodes=[],
        ranks=[],
        details={"time_limit": "1-00:00:00", "continued_by": "48213"},
        rule="slurm_time_limit_is_application",
    )
    s.finish(
        WorkloadState.FAILED,
        1,
        progress,
        reason="TIMEOUT (time limit 1-00:00:00); continued by job 48213",
    )


def _llama70b_xid(s: _Story) -> None:
    """48213: Xid 79 on gpu-a100-007, 63 ranks time out in NCCL, Slurm reports a node failure;
    approved restart without gpu-a100-007, training resumes and saves new checkpoints."""
    b = s.b
    nodes1 = a100(*range(1, 9))
    run1 = s.start(nodes1, timedelta(minutes=1, seconds=4))
    # Resumes from the last checkpoint of job 48188 (24 h at 9.6 s a step, 6 min start-up).
    previous = int((24 * 3600 - 6 * 60) // LLAMA70B_STEP) // LLAMA70B_EVERY * LLAMA70B_EVERY
    failure = b.ago(hours=10, minutes=12, seconds=b.rng.randint(0, 50))
    progress1 = s.train(
        run1,
        LLAMA70B_PACE,
        start_step=previous,
        start=run1.started_at + timedelta(minutes=7),
        until=failure,
    )
    node_fail = failure + timedelta(seconds=661)
    attempt1 = s.end_attempt(
        run1,
        node_fail + timedelta(seconds=1),
        AttemptExitState.NODE_FAIL,
        progress=progress1,
        noticed_after=timedelta(seconds=19),
    )
    bad = "gpu-a100-007"
    bad_rank = 6 * GPUS_PER_NODE + 2  # GPU 2 of the seventh node
    pid = 2231
    xid_line = f"NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, GPU has fallen off the bus."
    uptime = 318_402.113_528
    xid = s.anomaly(
        attempt1,
        key="xid79",
        category=FailureCategory.GPU_HARDWARE,
        attribution=Attribution.HARDWARE,
        confidence=0.97,
        severity=Severity.FATAL,
        signature="xid_79_fallen_off_bus",
        evidence_line=xid_line,
        excerpt=[
            f"[{uptime:.6f}] NVRM: GPU at PCI:0000:3b:00: GPU-5f3a9c1e-8d2b-4e07-b1a6-2c9e4d7f0a31",
            f"[{uptime:.6f}] NVRM: GPU Board Serial Number: 1652322041287",
            f"[{uptime + 0.000003:.6f}] {xid_line}",
            f"[{uptime + 0.000011:.6f}] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
            f"[{uptime + 0.000030:.6f}] NVRM: A GPU crash dump has been created. If possible, "
            "please run",
            "               NVRM: nvidia-bug-report.sh as root to collect this data before",
            "               NVRM: the NVIDIA kernel module is unloaded.",
        ],
        evidence_at=failure,
        nodes=[bad],
        ranks=[bad_rank],
        details={"xid": 79, "pci_bus": "0000:3b:00", "gpu_index": 2, "source": f"dmesg on {bad}"},
        rule="xid_79_is_hardware",
    )
    seq = 52817
    nccl_line = (
        f"[rank12]:[E ProcessGroupNCCL.cpp:616] [Rank 12] Watchdog caught collective operation "
        f"timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1048576, "
        "NumelOut=1048576, Timeout(ms)=600000) ran for 600041 milliseconds before timing out."
    )
    flood_at = failure + timedelta(seconds=600, milliseconds=41)
    s.anomaly(
        attempt1,
        key="nccl-watchdog",
        category=FailureCategory.NCCL_TIMEOUT,
        attribution=Attribution.HARDWARE,
        confidence=0.85,
        severity=Severity.FATAL,
        signature="nccl_watchdog_timeout",
        evidence_line=nccl_line,
        excerpt=[
            f" [{_log_time(failure - timedelta(seconds=4))}] iteration    {progress1.step}/  "
            f"250000 | consumed samples:     {progress1.step * 1024} | elapsed time per "
            "iteration (ms): 9598.7 | learning rate: 2.991E-04 | global batch size:  1024 | "
            "lm loss: 2.041266E+00 | loss scale: 1.0 | grad norm: 0.198 | number of skipped "
            "iterations:   0 | number of nan iterations:   0 |",
            nccl_line,
            f"[rank12]:[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank 12] Timeout at NCCL work: {seq}, "
            f"last enqueued NCCL work: {seq}, last completed NCCL work: {seq - 1}.",
            "[rank12]:[E ProcessGroupNCCL.cpp:630] [Rank 12] Some NCCL operations have failed or "
            "timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU "
            "operations might run on corrupted/incomplete data.",
            "[rank12]:[E ProcessGroupNCCL.cpp:636] [Rank 12] To avoid data inconsistency, we are "
            "taking the entire process down.",
            f"[rank3]:[E ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective operation "
            f"timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1048576, "
            "NumelOut=1048576, Timeout(ms)=600000) ran for 600044 milliseconds before timing out.",
        ],
        evidence_at=flood_at,
        nodes=nodes1,
        ranks=[r for r in range(len(nodes1) * GPUS_PER_NODE) if r != bad_rank],
        occurrences=63,
        details={
            "seq_num": seq,
            "op": "ALLREDUCE",
            "timeout_ms": 600000,
            "silent_ranks": [bad_rank],
            "culprit_nodes": [bad],
            "correlated_with": "xid79",
        },
        rule="nccl_timeout_with_xid_on_same_job",
        earlier_verdict=(Attribution.UNKNOWN, 0.5, "nccl_timeout_default"),
    )
    node_line = (
        f"slurmstepd: error: *** JOB {s.job} ON {bad} CANCELLED AT {_slurm_time(node_fail)} "
        "DUE TO NODE FAILURE ***"
    )
    s.anomaly(
        attempt1,
        key="node-fail",
        category=FailureCategory.SCHEDULER_EVENT,
        attribution=Attribution.HARDWARE,
        confidence=0.9,
        severity=Severity.FATAL,
        signature="slurm_node_failure",
        evidence_line=node_line,
        excerpt=[
            f"srun: error: Node failure on {bad}",
            "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.",
            node_line,
            "srun: error: gpu-a100-003: tasks 16-23: Killed",
            "srun: error: gpu-a100-001: tasks 0-7: Killed",
        ],
        evidence_at=node_fail,
        nodes=[bad],
        details={"scheduler_state": "NODE_FAIL", "node_reason": "Xid 79 GPU fell off the bus"},
        rule="node_failure_is_hardware",
    )
    approved_at = failure + timedelta(minutes=13, seconds=22)
    rec = s.recommend(
        1,
        attempt1,
        xid,
        action=RecommendationAction.RESTART_EXCLUDING,
        excluded=[bad],
        reason=(
            f"Xid 79 (GPU has fallen off the bus) on {bad} is a hardware fault. Restart from "
            f"checkpoint {progress1.checkpoint_step} without {bad}."
        ),
        status=RecommendationStatus.EXECUTED,
        decided_by=OPERATOR,
        decided_at=approved_at,
        note="NHC drained gpu-a100-007; on-call opened a hardware ticket.",
        state_before="NODE_FAIL",
    )
    requeued_at = approved_at + timedelta(seconds=12)
    s.state(requeued_at, 1, "failed", "requeued", "PENDING", reason="BeginTime")
    run2 = s.restart(
        2,
        a100(1, 2, 3, 4, 5, 6, 8, 9),
        approved_at + timedelta(minutes=2, seconds=31),
        recommendation=rec,
        excluded=[bad],
        was="requeued",
    )
    until = b.ago(seconds=b.rng.randint(4, 20))
    progress2 = s.resume(run2, progress1, warm_up=timedelta(minutes=6, seconds=12), until=until)
    s.keep_running(progress2)


def _whisper(s: _Story) -> None:
    """48191: healthy run to the end."""
    pace = _Pace(0.85, 5000, _hf_ckpt("/lustre/scratch/apatel/whisper-distill"), save_seconds=25)
    run = s.start(a100(9, 10), timedelta(seconds=38))
    progress = s.train(run, pace, start=run.started_at + timedelta(minutes=3), to_step=30000)
    s.complete(progress, ended_after=timedelta(seconds=55), noticed_after=timedelta(seconds=15))


def _deepseek_ib(s: _Story) -> None:
    """48198: InfiniBand retry-exceeded errors from gpu-a100-014; the job's own trap requeued
    it, and the recommendation to keep gpu-a100-014 out waits for an operator."""
    b = s.b
    nodes = a100(11, 14)
    pace = _Pace(4.1, 1000, _megatron_ckpt("/lustre/ckpt/deepseek-moe-16b"), save_seconds=30)
    run = s.start(nodes, timedelta(minutes=2, seconds=47))
    failure = b.ago(hours=1, minutes=36, seconds=b.rng.randint(0, 40))
    progress = s.train(run, pace, start=run.started_at + timedelta(minutes=4), until=failure)
    attempt = s.end_attempt(
        run,
        failure + timedelta(seconds=74),
        AttemptExitState.REQUEUED,
        exit_code=1,
        progress=progress,
        noticed_after=timedelta(seconds=10),
        pending_reason="Priority",
    )
    host = "gpu-a100-014"
    ib_line = (
        f"{host}:41877:42210 [2] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion "
        "from peer 10.31.4.117<48598> with error 12, opcode 0, len 0, vendor err 129 (Recv)"
    )
    ib = s.anomaly(
        attempt,
        key="ib-retry-exceeded",
        category=FailureCategory.INTERCONNECT,
        attribution=Attribution.HARDWARE,
        confidence=0.8,
        severity=Severity.FATAL,
        signature="nccl_ib_completion_error",
        evidence_line=ib_line,
        excerpt=[
            "mlx5_core 0000:c1:00.0 ibp193s0: Link down",
            "mlx5_core 0000:c1:00.0 ibp193s0: Link up",
            ib_line,
            f"{host}:41877:42210 [2] NCCL INFO transport/net.cc:1034 -> 6",
            f"{host}:41877:42210 [2] NCCL INFO proxy.cc:520 -> 6",
            f"{host}:41877:42210 [2] NCCL INFO proxy.cc:684 -> 6 [Proxy Thread]",
        ],
        evidence_at=failure,
        nodes=[host],
        ranks=[10],
        occurrences=4,
        details={"ib_device": "mlx5_2", "wc_status": 12, "meaning": "transport retry exceeded"},
        rule="ib_completion_error_is_hardware",
    )
    nccl_line = (
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error, "
        "NCCL version 2.20.5"
    )
    s.anomaly(
        attempt,
        key="nccl-remote-error",
        category=FailureCategory.NCCL_ERROR,
        attribution=Attribution.HARDWARE,
        confidence=0.7,
        severity=Severity.ERROR,
        signature="nccl_remote_error",
        evidence_line=nccl_line,
        excerpt=[
            "[rank3]: Traceback (most recent call last):",
            '[rank3]:   File "/workspace/Megatron-LM/pretrain_gpt.py", line 243, in <module>',
            "[rank3]:     pretrain(",
            f"[rank3]: {nccl_line}",
            "[rank3]: ncclRemoteError: A call failed possibly due to a network error or a "
            "remote process exiting prematurely.",
            "[rank3]: Last error:",
            "[rank3]: NET/IB : Got completion from peer 10.31.4.117<48598> with error 12, "
            "opcode 0, len 0, vendor err 129 (Recv)",
        ],
        evidence_at=failure + timedelta(seconds=2),
        nodes=nodes,
        ranks=[r for r in range(16) if r != 10],
        occurrences=15,
        details={"culprit_nodes": [host], "correlated_with": "ib-retry-exceeded"},
        rule="nccl_error_follows_ib_error",
        earlier_verdict=(Attribution.SYSTEM_SOFTWARE, 0.5, "nccl_error_default"),
    )
    s.recommend(
        1,
        attempt,
        ib,
        action=RecommendationAction.RESTART_EXCLUDING,
        excluded=[host],
        reason=(
            f"InfiniBand transport retries exceeded on {host} (mlx5_2 link flapped). The job "
            f"requeued itself; keep {host} out of the next attempt and resume from checkpoint "
            f"{progress.checkpoint_step}."
        ),
        status=RecommendationStatus.AWAITING_APPROVAL,
    )
    s.finish(
        WorkloadState.REQUEUED,
        1,
        progress,
        reason="Requeued by the job (exit code 1); pending: Priority",
    )


def _megatron_iteration(at: datetime, step: int, loss: str, grad_norm: str) -> str:
    return (
        f" [{_log_time(at)}] iteration     {step}/   20000 | consumed samples:      "
        f"{step * 1024} | elapsed time per iteration (ms): 4102.6 | learning rate: 2.872E-05 | "
        f"global batch size:  1024 | lm loss: {loss} | loss scale: 1.0 | grad norm: "
        f"{grad_norm} | number of skipped iterations:   0 | number of nan iterations:   0 |"
    )


def _llama13b_nan(s: _Story) -> None:
    """48201: the loss diverges to NaN at the same iteration twice; restart, then stop."""
    nodes = a100(9, 10)
    pace = _Pace(4.1, 500, _megatron_ckpt("/lustre/ckpt/llama-13b-math-cpt"), save_seconds=20)
    run1 = s.start(nodes, timedelta(seconds=52))
    nan_step = 3187
    progress1 = s.train(run1, pace, start=run1.started_at + timedelta(minutes=3), to_step=nan_step)

    def nan_anomaly(attempt: Attempt, at: datetime, key: str) -> Anomaly:
        line = (
            f"RuntimeError: Rank 5, node gpu-a100-009, device 5, iteration {nan_step + 1}: "
            "Unexpected result nan (message='found NaN in local grad norm in backward pass "
            "before data-parallel communication collective')"
        )
        return s.anomaly(
            attempt,
            key=key,
            category=FailureCategory.NAN_DIVERGENCE,
            attribution=Attribution.APPLICATION,
            confidence=0.9,
            severity=Severity.FATAL,
            signature="megatron_nan_grad_norm",
            evidence_line=line,
            excerpt=[
                _megatron_iteration(
                    at - timedelta(seconds=12), nan_step - 2, "1.861240E+00", "2.913"
                ),
                _megatron_iteration(
                    at - timedelta(seconds=8), nan_step - 1, "2.377104E+00", "48.227"
                ),
                _megatron_iteration(
                    at - timedelta(seconds=4), nan_step, "7.904512E+00", "2917.443"
                ),
                "[rank5]: Traceback (most recent call last):",
                '[rank5]:   File "/workspace/Megatron-LM/megatron/core/distributed/'
                'param_and_grad_buffer.py", line 207, in check_for_nan_in_grad',
                "[rank5]:     assert not norm_is_nan, (",
                f"[rank5]: {line}",
            ],
            evidence_at=at,
            nodes=[],
            ranks=list(range(16)),
            occurrences=16,
            details={"iteration": nan_step + 1, "grad_norm_before": 2917.443},
            rule="nan_is_application",
        )

    failure1 = progress1.at + timedelta(seconds=4)
    attempt1 = s.end_attempt(
        run1,
        failure1 + timedelta(seconds=31),
        AttemptExitState.FAILED,
        exit_code=1,
        progress=progress1,
        noticed_after=timedelta(seconds=8),
    )
    nan1 = nan_anomaly(attempt1, failure1, "nan-1")
    approved1 = failure1 + timedelta(minutes=6, seconds=40)
    rec1 = s.recommend(
        1,
        attempt1,
        nan1,
        action=RecommendationAction.RESTART,
        reason=(
            f"Loss diverged to NaN at iteration {nan_step + 1}. First occurrence: restart from "
            f"checkpoint {progress1.checkpoint_step} (1 of 3 attempts without a new checkpoint)."
        ),
        status=RecommendationStatus.EXECUTED,
        decided_by=OPERATOR,
        decided_at=approved1,
        note="One retry; if it diverges again we stop and lower the LR.",
    )
    run2 = s.restart(2, nodes, approved1 + timedelta(minutes=1, seconds=5), recommendation=rec1)
    progress2 = s.resume(
        run2, progress1, warm_up=timedelta(minutes=2, seconds=40), to_step=nan_step
    )
    failure2 = progress2.at + timedelta(seconds=4)
    attempt2 = s.end_attempt(
        run2,
        failure2 + timedelta(seconds=29),
        AttemptExitState.FAILED,
        exit_code=1,
        progress=progress2,
        noticed_after=timedelta(seconds=8),
    )
    nan2 = nan_anomaly(attempt2, failure2, "nan-2")
    s.recommend(
        1,
        attempt2,
        nan2,
        action=RecommendationAction.STOP,
        reason=(
            f"NaN at iteration {nan_step + 1} again after resuming from checkpoint "
            f"{progress2.checkpoint_step}: the divergence is deterministic, a restart cannot "
            "fix it."
        ),
        status=RecommendationStatus.EXECUTED,
        decided_by=ADMIN,
        decided_at=failure2 + timedelta(minutes=9, seconds=12),
        note="Stopping; jnovak will relaunch with lr 1.5e-5.",
    )
    # No checkpoint since the resumed one: progress2 still names it.
    s.finish(
        WorkloadState.STOPPED,
        2,
        progress2,
        reason="Stopped by recovery: deterministic NaN at iteration 3188",
    )


def _neox_storage(s: _Story) -> None:
    """48205: a checkpoint write hits a stale Lustre file handle; one restart, then done."""
    nodes = a100(12, 13)
    path = _deepspeed_ckpt("/lustre/scratch/ckpt/gpt-neox-20b")
    run1 = s.start(nodes, timedelta(minutes=1, seconds=18))
    progress1 = s.train(
        run1,
        _Pace(3.0, 1000, path, save_seconds=45),
        start=run1.started_at + timedelta(minutes=5),
        to_step=5999,
    )
    failure = progress1.at + timedelta(seconds=9)
    attempt1 = s.end_attempt(
        run1,
        failure + timedelta(seconds=22),
        AttemptExitState.FAILED,
        exit_code=1,
        progress=progress1,
        noticed_after=timedelta(seconds=9),
    )
    target = f"{path(6000)}/mp_rank_00_model_states.pt"
    line = "OSError: [Errno 116] Stale file handle"
    stamp = f"{failure:%Y-%m-%d %H:%M:%S},118"
    io = s.anomaly(
        attempt1,
        key="stale-handle",
        category=FailureCategory.STORAGE_IO,
        attribution=Attribution.SYSTEM_SOFTWARE,
        confidence=0.8,
        signature="errno_stale_file_handle",
        evidence_line=line,
        excerpt=[
            f"[{stamp}] [INFO] [logging.py:96:log_dist] [Rank 0] Saving model checkpoint: {target}",
            f"[{stamp}] [INFO] [torch_checkpoint_engine.py:21:save] [Torch] Saving {target}...",
            "Traceback (most recent call last):",
            '  File "/opt/conda/lib/python3.10/site-packages/torch/serialization.py", line 628, '
            "in save",
            "    with _open_zipfile_writer(f) as opened_zipfile:",
            line,
            "LustreError: 11-0: scratch-OST0007-osc-ffff9a1c3b6e5000: operation ost_write to "
            "node 10.10.2.17@o2ib failed: rc = -107",
        ],
        evidence_at=failure,
        ranks=[0],
        details={"path": target, "filesystem": "lustre scratch"},
        rule="storage_errno_is_system_software",
    )
    approved = failure + timedelta(minutes=4, seconds=3)
    rec = s.recommend(
        1,
        attempt1,
        io,
        action=RecommendationAction.RESTART,
        reason=(
            "Checkpoint write failed with a stale Lustre file handle (OST0007 reconnecting). "
            f"Restart from checkpoint {progress1.checkpoint_step}; no node is implicated."
        ),
        status=RecommendationStatus.EXECUTED,
        decided_by=OPERATOR,
        decided_at=approved,
        note="Storage team confirms OST0007 failed over and is back.",
    )
    run2 = s.restart(2, nodes, approved + timedelta(minutes=1, seconds=2), recommendation=rec)
    progress2 = s.resume(run2, progress1, warm_up=timedelta(minutes=4, seconds=30), to_step=13000)
    s.complete(progress2, ended_after=timedelta(seconds=70), noticed_after=timedelta(seconds=12))


def _mistral_oom(s: _Story) -> None:
    """48209: CUDA out of memory at 32k context on the first steps; the operator rejects a
    restart that would fail the same way."""
    run = s.start(a100(15, 16), timedelta(seconds=44))
    progress = s.train(
        run,
        _Pace(6.3, 500, _hf_ckpt("/lustre/scratch/emartin/mistral-sft-32k")),
        start=run.started_at + timedelta(minutes=3, seconds=20),
        to_step=37,
    )
    failure = progress.at + timedelta(seconds=5)
    attempt = s.end_attempt(
        run,
        failure + timedelta(seconds=38),
        AttemptExitState.FAILED,
        exit_code=1,
        progress=progress,
        noticed_after=timedelta(seconds=11),
    )
    line = (
        "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
        "GPU 3 has a total capacity of 79.14 GiB of which 1.23 GiB is free. Including "
        "non-PyTorch memory, this process has 77.90 GiB memory in use. Of the allocated memory "
        "74.61 GiB is allocated by PyTorch, and 1.72 GiB is reserved by PyTorch but unallocated."
        " If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )
    oom = s.anomaly(
        attempt,
        key="cuda-oom",
        category=FailureCategory.GPU_OOM,
        attribution=Attribution.APPLICATION,
        confidence=0.95,
        signature="torch_cuda_oom",
        evidence_line=line,
        excerpt=[
            "[rank3]: Traceback (most recent call last):",
            '[rank3]:   File "/workspace/sft/train_sft.py", line 212, in <module>',
            "[rank3]:     trainer.train()",
            '[rank3]:   File "/opt/conda/lib/python3.11/site-packages/transformers/trainer.py", '
            "line 2164, in train",
            "[rank3]:     return inner_training_loop(",
            '[rank3]:   File "/opt/conda/lib/python3.11/site-packages/torch/utils/checkpoint.py",'
            " line 1124, in unpack_hook",
            line,
        ],
        evidence_at=failure,
        ranks=[3, 7, 11, 12, 15],
        occurrences=5,
        details={"tried_to_allocate": "2.00 GiB", "max_seq_len": 32768, "step": 38},
        rule="cuda_oom_is_application",
    )
    s.recommend(
        1,
        attempt,
        oom,
        action=RecommendationAction.RESTART,
        reason="CUDA out of memory on 5 of 16 ranks at step 38; policy restarts crashes.",
        status=RecommendationStatus.REJECTED,
        decided_by=OPERATOR,
        decided_at=failure + timedelta(minutes=11, seconds=27),
        note="Deterministic OOM at 32k context; emartin is lowering the micro-batch. No restart.",
    )
    s.finish(WorkloadState.FAILED, 1, progress, reason="FAILED (exit code 1)")


def _sdxl_healthy(s: _Story) -> None:
    """48216: a healthy fine-tune, still running."""
    run = s.start(a100(16), timedelta(minutes=1, seconds=3))
    progress = s.train(
        run,
        _Pace(1.45, 10000, _hf_ckpt("/lustre/scratch/tnguyen/sdxl-product"), save_seconds=18),
        start=run.started_at + timedelta(minutes=2),
        until=s.b.ago(seconds=s.rng.randint(3, 15)),
    )
    s.keep_running(progress)


def _mixtral_straggler(s: _Story) -> None:
    """48221: GPU 2 of gpu-a100-012 runs with hardware slowdown; the whole job slows to its pace.
    Restarting without the node waits for approval."""
    b = s.b
    path = _megatron_ckpt("/lustre/ckpt/mixtral-sft-r4")
    run = s.start(a100(12, 13), timedelta(minutes=1, seconds=40))
    slow_from = b.ago(minutes=52)
    fast = s.train(
        run, _Pace(2.2, 2000, path), start=run.started_at + timedelta(minutes=4), until=slow_from
    )
    slow = s.train(
        run,
        _Pace(3.05, 2000, path),
        start_step=fast.step,
        start=fast.at,
        until=b.ago(seconds=b.rng.randint(2, 9)),
        checkpoint=(fast.checkpoint_step, fast.checkpoint_at) if fast.checkpoint_step else None,
    )
    # The attempt produced a checkpoint if it saved one at either pace.
    attempt = s.keep_running(replace(slow, saved=fast.saved or slow.saved))
    evidence_at = slow_from + timedelta(minutes=10)
    step_at = slow.step - 3
    line = (
        'DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{gpu="2",UUID="GPU-8a1d3c55-0f2e-4b9a-9e61-'
        '7c0b2d4e9f13",Hostname="gpu-a100-012",modelName="NVIDIA A100-SXM4-80GB"} 8'
    )
    straggler = s.anomaly(
        attempt,
        key="straggler-012",
        kind=AnomalyKind.STRAGGLER,
        category=FailureCategory.GPU_HARDWARE,
        attribution=Attribution.HARDWARE,
        confidence=0.75,
        severity=Severity.WARNING,
        signature="straggler_rank_throughput",
        evidence_line=line,
        excerpt=[
            f"[rank2] step {step_at} | fwd-bwd 2.93s | optimizer 0.09s | 2,118 tok/s/gpu",
            f"[rank9] step {step_at} | fwd-bwd 2.04s | optimizer 0.08s | 3,046 tok/s/gpu",
            f"[rank14] step {step_at} | fwd-bwd 2.01s | optimizer 0.08s | 3,071 tok/s/gpu",
            'DCGM_FI_DEV_SM_CLOCK{gpu="2",Hostname="gpu-a100-012"} 1005',
            'DCGM_FI_DEV_SM_CLOCK{gpu="1",Hostname="gpu-a100-012"} 1410',
            line,
        ],
        evidence_at=evidence_at,
        nodes=["gpu-a100-012"],
        ranks=[2],
        occurrences=1,
        details={
            "baseline_tokens_per_s_per_gpu": 3046,
            "observed_tokens_per_s_per_gpu": 2118,
            "slowdown_percent": 30,
            "threshold_percent": 20,
            "window_minutes": 10,
            "throttle_reason": "HW_SLOWDOWN (0x8)",
        },
        rule="sustained_throughput_drop_with_hw_slowdown",
    )
    s.recommend(
        1,
        attempt,
        straggler,
        action=RecommendationAction.RESTART_EXCLUDING,
        excluded=["gpu-a100-012"],
        reason=(
            "Rank 2 on gpu-a100-012 is 30 % below its baseline for 10 min (GPU 2 reports "
            "HW slowdown, SM clock 1005 MHz); the whole job runs at its pace. Restart from "
            f"checkpoint {slow.checkpoint_step} without gpu-a100-012."
        ),
        status=RecommendationStatus.AWAITING_APPROVAL,
    )


def _qwen_illegal_access(s: _Story) -> None:
    """48224: an illegal memory access at the same step in two attempts (the job requeues
    itself); the restart advice is superseded by advice to stop, awaiting approval."""
    nodes = a100(10, 15)
    bad_step = 1230

    def illegal_access(attempt: Attempt, at: datetime, key: str, confidence: float) -> Anomaly:
        line = "[rank13]: RuntimeError: CUDA error: an illegal memory access was encountered"
        return s.anomaly(
            attempt,
            key=key,
            category=FailureCategory.CUDA_ERROR_APP,
            attribution=Attribution.APPLICATION if confidence > 0.6 else Attribution.UNKNOWN,
            confidence=confidence,
            severity=Severity.FATAL,
            signature="cuda_illegal_memory_access",
            evidence_line=line,
            excerpt=[
                '[rank13]:   File "/opt/conda/lib/python3.11/site-packages/flash_attn/'
                'flash_attn_interface.py", line 96, in _flash_attn_varlen_forward',
                "[rank13]:     out, softmax_lse, S_dmask, rng_state = flash_attn_cuda.varlen_fwd(",
                "[rank13]:                                              ^^^^^^^^^^^^^^^^^^^^^^^^^",
                line,
                "[rank13]: CUDA kernel errors might be asynchronously reported at some other API "
                "call, so the stacktrace below might be incorrect.",
                "[rank13]: For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
                "[rank13]: Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
            ],
            evidence_at=at,
            ranks=[13],
            details={"step": bad_step + 1, "kernel": "flash_attn varlen_fwd"},
            rule=(
                "same_cuda_error_same_step_is_application"
                if confidence > 0.6
                else "cuda_error_without_visible_bug_is_unknown"
            ),
        )

    pace = _Pace(11.0, 250, _deepspeed_ckpt("/lustre/scratch/ychoi/qwen2-72b-sft"), save_seconds=60)
    run1 = s.start(nodes, timedelta(seconds=57))
    progress1 = s.train(run1, pace, start=run1.started_at + timedelta(minutes=8), to_step=bad_step)
    failure1 = progress1.at + timedelta(seconds=7)
    end1 = failure1 + timedelta(seconds=45)
    attempt1 = s.end_attempt(
        run1,
        end1,
        AttemptExitState.REQUEUED,
        exit_code=1,
        progress=progress1,
        noticed_after=timedelta(seconds=6),
        pending_reason="BeginTime",
    )
    first = illegal_access(attempt1, failure1, "illegal-access-1", 0.55)
    rec1 = s.recommend(
        1,
        attempt1,
        first,
        action=RecommendationAction.RESTART,
        reason=(
            f"CUDA illegal memory access in flash-attn on rank 13 at step {bad_step + 1}; "
            f"restart from checkpoint {progress1.checkpoint_step}."
        ),
        status=RecommendationStatus.SUPERSEDED,
    )
    start2 = end1 + timedelta(minutes=2, seconds=14)
    run2 = s.restart(2, nodes, start2, requeued_by="job", was="requeued")
    progress2 = s.resume(
        run2, progress1, warm_up=timedelta(minutes=7, seconds=30), to_step=bad_step
    )
    failure2 = progress2.at + timedelta(seconds=7)
    attempt2 = s.end_attempt(
        run2,
        failure2 + timedelta(seconds=44),
        AttemptExitState.REQUEUED,
        exit_code=1,
        progress=progress2,
        noticed_after=timedelta(seconds=6),
        pending_reason="Priority",
    )
    second = illegal_access(attempt2, failure2, "illegal-access-2", 0.8)
    segv_line = (
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -11) "
        "local_rank: 5 (pid: 48812) of binary: /opt/conda/bin/python3.11"
    )
    s.anomaly(
        attempt2,
        key="segv-teardown",
        category=FailureCategory.SEGFAULT,
        attribution=Attribution.UNKNOWN,
        confidence=0.5,
        severity=Severity.ERROR,
        signature="torchrun_child_sigsegv",
        evidence_line=segv_line,
        excerpt=[
            "Fatal Python error: Segmentation fault",
            "",
            "Thread 0x00007f3c2effd640 (most recent call first):",
            '  File "/opt/conda/lib/python3.11/threading.py", line 331 in wait',
            segv_line,
            "  exitcode  : -11 (pid: 48812)",
            "  traceback : Signal 11 (SIGSEGV) received by PID 48812",
        ],
        evidence_at=failure2 + timedelta(seconds=31),
        nodes=["gpu-a100-015"],
        ranks=[13],
        details={"signal": "SIGSEGV", "during": "teardown after the CUDA error"},
        rule="segfault_default_unknown",
    )
    rec2 = s.recommend(
        1,
        attempt2,
        second,
        action=RecommendationAction.STOP,
        reason=(
            f"The same CUDA illegal memory access at step {bad_step + 1} in 2 attempts in a row, "
            f"no new checkpoint since step {progress2.checkpoint_step}: an application fault a "
            "restart cannot fix. The job keeps requeueing itself; stop it."
        ),
        at=second.detected_at + timedelta(seconds=3),
        status=RecommendationStatus.AWAITING_APPROVAL,
    )
    s.supersede(rec1, rec2, second.detected_at + timedelta(seconds=3), 2)
    s.finish(
        WorkloadState.REQUEUED,
        2,
        progress2,
        reason="Requeued by the job (exit code 1); pending: Priority",
    )


def _vit_hang(s: _Story) -> None:
    """48230: no progress for over 30 minutes; data loader workers blocked on NFS."""
    b = s.b
    nodes = a100(15)
    steps_per_epoch = 5004

    def path(step: int) -> str:
        return f"/nfs/filer-02/okoval/vit-h-14/checkpoint-{step // 5004 - 1}.pth.tar"

    run = s.start(nodes, timedelta(minutes=1, seconds=2))
    silent_since = b.ago(minutes=47, seconds=b.rng.randint(0, 30))
    progress = s.train(
        run,
        _Pace(0.72, steps_per_epoch, path, save_seconds=15),
        start=run.started_at + timedelta(minutes=3),
        until=silent_since,
    )
    attempt = s.keep_running(progress)
    epoch, batch = divmod(progress.step, steps_per_epoch)

    def timm_line(batch_index: int, loss: str, avg: str) -> str:
        percent = 100 * batch_index // steps_per_epoch
        return (
            f"Train: {epoch} [{batch_index:>4d}/{steps_per_epoch} ({percent:>3d}%)]  Loss: {loss} "
            f"({avg})  Time: 0.714s, 5737.12/s  (0.718s, 5705.37/s)  LR: 1.200e-03  "
            "Data: 0.011 (0.013)"
        )

    line = timm_line(batch, "4.217", "4.301")
    hang = s.anomaly(
        attempt,
        key="hang-no-progress",
        kind=AnomalyKind.HANG,
        category=FailureCategory.STORAGE_IO,
        attribution=Attribution.SYSTEM_SOFTWARE,
        confidence=0.6,
        severity=Severity.ERROR,
        signature="no_progress",
        evidence_line=line,
        excerpt=[
            timm_line(max(batch - 100, 0), "4.233", "4.303"),
            timm_line(max(batch - 50, 0), "4.198", "4.302"),
            line,
            "nfs: server filer-02 not responding, still trying",
            "INFO: task pt_data_worker:81234 blocked for more than 122 seconds.",
            '"echo 0 > /proc/sys/kernel/hung_task_timeout_secs" disables this message.',
        ],
        evidence_at=silent_since + timedelta(minutes=30),
        nodes=nodes,
        ranks=list(range(8)),
        occurrences=1,
        details={
            "last_progress_at": silent_since.isoformat(),
            "median_step_seconds": 0.72,
            "hang_timeout_minutes": 30,
            "blocked_on": "nfs filer-02",
        },
        rule="hang_with_nfs_not_responding",
    )
    s.recommend(
        1,
        attempt,
        hang,
        action=RecommendationAction.RESTART,
        reason=(
            "No progress for 30 min (median step 0.72 s, policy minimum 30 min); data loader "
            "workers are blocked on NFS filer-02. Restart from checkpoint "
            f"{progress.checkpoint_step} once the filer answers."
        ),
        status=RecommendationStatus.AWAITING_APPROVAL,
    )


def _bert_keyerror(s: _Story) -> None:
    """48233: a dataset column is missing; the approved stop finds the job already failed."""
    run = s.start(a100(10), timedelta(seconds=31))
    failure = run.started_at + timedelta(minutes=2, seconds=48)
    attempt = s.end_attempt(
        run,
        failure + timedelta(seconds=6),
        AttemptExitState.FAILED,
        exit_code=1,
        noticed_after=timedelta(seconds=9),
    )
    line = "KeyError: 'text'"
    error = s.anomaly(
        attempt,
        key="keyerror",
        category=FailureCategory.APP_EXCEPTION,
        attribution=Attribution.APPLICATION,
        confidence=0.9,
        severity=Severity.FATAL,
        signature="python_traceback_exception",
        evidence_line=line,
        excerpt=[
            "Traceback (most recent call last):",
            '  File "/home/rkim/bert-mlm/run_mlm.py", line 641, in <module>',
            "    main()",
            '  File "/home/rkim/bert-mlm/run_mlm.py", line 532, in main',
            "    tokenized_datasets = raw_datasets.map(",
            '  File "/home/rkim/bert-mlm/run_mlm.py", line 517, in tokenize_function',
            "    return tokenizer(examples[text_column_name], return_special_tokens_mask=True)",
            line,
        ],
        evidence_at=failure,
        ranks=list(range(8)),
        occurrences=8,
        details={"exception": "KeyError", "step": 0},
        rule="python_exception_is_application",
    )
    s.recommend(
        1,
        attempt,
        error,
        action=RecommendationAction.STOP,
        reason="KeyError before the first step: a configuration error a restart cannot fix.",
        status=RecommendationStatus.SKIPPED,
        decided_by=OPERATOR,
        decided_at=failure + timedelta(minutes=3, seconds=10),
        note="Agreed, no retries.",
        skipped_reason=f"job {s.job} is already FAILED; nothing to cancel",
    )
    s.finish(WorkloadState.FAILED, 1, reason="FAILED (exit code 1)")


def _not_opted_in(s: _Story) -> None:
    """48236: pending for resources, listed as not opted in because of a malformed comment."""
    s.finish(WorkloadState.PENDING, 0, reason="Resources")


# --- demo-h100: action mode -----------------------------------------------------------------

H100_NODES = h100(*range(1, 9))


def _seed_h100(b: _Builder) -> None:
    cluster = b.cluster(
        H100_CLUSTER,
        scheduler_kind=SchedulerKind.SIMULATED,
        connection=Connection.SIMULATED,
        mode=ClusterMode.ACTION,
        acknowledge_scheduler_actions=True,
        environment="prod",
        connection_settings={"recorded": {"nodes": hostlist(H100_NODES), "gpus_per_node": 8}},
    )
    specs = {name: _NodeSpec(state="ALLOCATED") for name in H100_NODES}
    specs["gpu-h100-005"] = _NodeSpec(
        state="DRAINED",
        reason="IB mlx5_0 local catastrophic error",
        health=NodeHealth.UNHEALTHY,
        times_implicated=1,
        implicated_hours_ago=6.3,
        excluded_hours=24,
    )
    specs["gpu-h100-008"] = _NodeSpec(
        state="ALLOCATED",
        health=NodeHealth.SUSPECT,
        times_implicated=1,
        implicated_hours_ago=1.3,
    )
    b.nodes(cluster, H100_NODES, specs)
    act = _opt_in(OptInMode.ACT)
    b.story(
        cluster,
        "91402",
        _llama31_ib,
        name="llama-3.1-70b-cpt-code",
        user="mchen",
        partition="gpu",
        workflow_id="llama31-70b-cpt-code",
        submit_time=b.ago(hours=30, minutes=5),
        **act,
    )
    b.story(
        cluster,
        "91410",
        _gemma_host_oom,
        name="gemma-2-27b-sft",
        user="apatel",
        partition="gpu",
        submit_time=b.ago(hours=26, minutes=2),
        **act,
    )
    b.story(
        cluster,
        "91417",
        _dit_watchdog,
        name="dit-xl-video-pretrain",
        user="hli",
        partition="gpu-long",
        submit_time=b.ago(hours=16, minutes=3),
        **act,
    )
    b.story(
        cluster,
        "91423",
        _longctx_thermal,
        name="llama-3-8b-longctx",
        user="okoval",
        partition="gpu",
        submit_time=b.ago(hours=12, minutes=1),
        **act,
    )


def _llama31_ib(s: _Story) -> None:
    """91402: local catastrophic error on the IB adapter of gpu-h100-005; restarted without it
    automatically, productive again minutes later."""
    b = s.b
    pace = _Pace(5.2, 1000, _megatron_ckpt("/weka/ckpt/llama31-70b-cpt-code"), save_seconds=25)
    run1 = s.start(h100(2, 3, 4, 5), timedelta(minutes=1, seconds=9))
    failure = b.ago(hours=6, minutes=18, seconds=b.rng.randint(0, 40))
    progress1 = s.train(run1, pace, start=run1.started_at + timedelta(minutes=5), until=failure)
    end1 = failure + timedelta(seconds=19)
    attempt1 = s.end_attempt(
        run1,
        end1,
        AttemptExitState.FAILED,
        exit_code=1,
        progress=progress1,
        noticed_after=timedelta(seconds=5),
    )
    host = "gpu-h100-005"
    line = (
        f"{host}:2231:2290 [3] transport/net_ib.cc:131 NCCL WARN NET/IB : Got async event : "
        "local catastrophic error"
    )
    ib = s.anomaly(
        attempt1,
        key="ib-catastrophic",
        category=FailureCategory.INTERCONNECT,
        attribution=Attribution.HARDWARE,
        confidence=0.93,
        severity=Severity.FATAL,
        signature="nccl_ib_async_catastrophic",
        evidence_line=line,
        excerpt=[
            "mlx5_core 0000:3b:00.0: mlx5_health_try_recover:327:(pid 1893): handling bad "
            "device here",
            line,
            f"{host}:2231:2290 [3] misc/ibvwrap.cc:229 NCCL WARN Call to ibv_get_async_event "
            "failed",
            f"{host}:2231:2297 [3] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion "
            "from peer 10.42.0.13<45682> with error 5, opcode 32581, len 0, vendor err 249 (Send)",
            "[rank27]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 27] NCCL watchdog thread "
            "terminated with exception: NCCL error: remote process exited or there was a network "
            "error, NCCL version 2.21.5",
        ],
        evidence_at=failure,
        nodes=[host],
        ranks=[27],
        occurrences=2,
        details={"ib_device": "mlx5_0", "event": "IBV_EVENT_DEVICE_FATAL"},
        rule="ib_catastrophic_error_is_hardware",
    )
    rec = s.recommend(
        1,
        attempt1,
        ib,
        action=RecommendationAction.RESTART_EXCLUDING,
        excluded=[host],
        reason=(
            f"Local catastrophic error on the InfiniBand adapter of {host}: hardware. Restart "
            f"from checkpoint {progress1.checkpoint_step} without {host}."
        ),
        # Level-triggered: decided on the scheduler's state, once it reports the failure.
        at=max(ib.detected_at + timedelta(seconds=2), end1 + timedelta(seconds=6)),
        status=RecommendationStatus.EXECUTED,
        state_before="FAILED",
    )
    start2 = rec.created_at + timedelta(seconds=38)
    run2 = s.restart(2, h100(1, 2, 3, 4), start2, recommendation=rec, excluded=[host])
    until = b.ago(seconds=b.rng.randint(2, 12))
    progress2 = s.resume(run2, progress1, warm_up=timedelta(minutes=4, seconds=50), until=until)
    s.keep_running(progress2)


def _gemma_host_oom(s: _Story) -> None:
    """91410: data loader workers OOM-killed by the cgroup; restarted automatically, completed."""
    nodes = h100(6, 7)
    pace = _Pace(3.4, 500, _hf_ckpt("/weka/scratch/apatel/gemma-2-27b-sft"), save_seconds=30)
    run1 = s.start(nodes, timedelta(seconds=26))
    progress1 = s.train(run1, pace, start=run1.started_at + timedelta(minutes=3), to_step=2093)
    failure = progress1.at + timedelta(seconds=3)
    end1 = failure + timedelta(seconds=12)
    attempt1 = s.end_attempt(
        run1,
        end1,
        AttemptExitState.OUT_OF_MEMORY,
        progress=progress1,
        noticed_after=timedelta(seconds=4),
    )
    line = (
        f"slurmstepd: error: Detected 1 oom_kill event in StepId={s.job}.0. Some of the step "
        "tasks have been OOM Killed."
    )
    oom = s.anomaly(
        attempt1,
        key="host-oom",
        category=FailureCategory.HOST_OOM,
        attribution=Attribution.APPLICATION,
        confidence=0.85,
        severity=Severity.FATAL,
        signature="slurm_oom_kill",
        evidence_line=line,
        excerpt=[
            "[rank12]: RuntimeError: DataLoader worker (pid 81234) is killed by signal: Killed.",
            "[rank12]: ",
            "[rank12]: The above exception was the direct cause of the following exception:",
            line,
            "srun: error: gpu-h100-007: task 12: Out Of Memory",
        ],
        evidence_at=failure,
        nodes=["gpu-h100-007"],
        ranks=[12],
        details={"cgroup": "step", "killed": "pt_data_worker"},
        rule="host_oom_is_application",
    )
    rec = s.recommend(
        1,
        attempt1,
        oom,
        action=RecommendationAction.RESTART,
        reason=(
            "Host memory exhausted by data loader workers on gpu-h100-007 (first occurrence). "
            f"Restart from checkpoint {progress1.checkpoint_step}."
        ),
        at=max(oom.detected_at + timedelta(seconds=2), end1 + timedelta(seconds=5)),
        status=RecommendationStatus.EXECUTED,
        state_before="OUT_OF_MEMORY",
    )
    run2 = s.restart(2, nodes, rec.created_at + timedelta(seconds=41), recommendation=rec)
    progress2 = s.resume(run2, progress1, warm_up=timedelta(minutes=2, seconds=45), to_step=6000)
    s.complete(progress2, ended_after=timedelta(seconds=48), noticed_after=timedelta(seconds=9))


def _dit_watchdog(s: _Story) -> None:
    """91417: NCCL cannot create a shared memory segment; no controller claims the restart in
    time, the watchdog lets Slurm requeue the job normally, and the recommendation expires."""
    b = s.b
    nodes = h100(6, 7)
    pace = _Pace(7.5, 500, _megatron_ckpt("/weka/ckpt/dit-xl-video"), save_seconds=35)
    run1 = s.start(nodes, timedelta(minutes=3, seconds=15))
    failure = b.ago(hours=3, minutes=12, seconds=b.rng.randint(0, 40))
    progress1 = s.train(run1, pace, start=run1.started_at + timedelta(minutes=4), until=failure)
    # The poller sees the job requeued only once the watchdog lets it go (below).
    attempt1 = s.end_attempt(
        run1,
        failure + timedelta(seconds=27),
        AttemptExitState.REQUEUED,
        exit_code=1,
        progress=progress1,
    )
    host = "gpu-h100-006"
    line = (
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "NCCLUtils.hpp:317, unhandled system error (run with NCCL_DEBUG=INFO for details), "
        "NCCL version 2.21.5"
    )
    error = s.anomaly(
        attempt1,
        key="nccl-shm",
        category=FailureCategory.NCCL_ERROR,
        attribution=Attribution.SYSTEM_SOFTWARE,
        confidence=0.7,
        signature="nccl_system_error_shm",
        evidence_line=line,
        excerpt=[
            f"{host}:97:183 [4] include/shm.h:48 NCCL WARN Error while creating shared memory "
            "segment /dev/shm/nccl-7Qk1Xa (size 9637888)",
            f"{host}:97:183 [4] NCCL INFO transport/shm.cc:101 -> 2",
            f"{host}:97:183 [4] NCCL INFO init.cc:1235 -> 2",
            f"[rank4]: {line}",
            "[rank4]: ncclSystemError: System call (e.g. socket, malloc) or external library "
            "call failed or device error. ",
            "[rank4]: Last error:",
            "[rank4]: Error while creating shared memory segment /dev/shm/nccl-7Qk1Xa "
            "(size 9637888)",
        ],
        evidence_at=failure,
        nodes=[host],
        ranks=[4],
        occurrences=3,
        details={"cause": "/dev/shm full on gpu-h100-006"},
        rule="nccl_system_error_is_system_software",
    )
    rec = s.recommend(
        1,
        attempt1,
        error,
        action=RecommendationAction.RESTART,
        reason=(
            "NCCL could not create a shared memory segment on gpu-h100-006 (/dev/shm full). "
            f"Restart from checkpoint {progress1.checkpoint_step}."
        ),
        status=RecommendationStatus.EXPIRED,
    )
    released_at = error.detected_at + timedelta(seconds=300)
    s.event(
        AuditKind.WATCHDOG_RELEASED,
        WATCHDOG,
        released_at,
        1,
        recommendation=rec.pk,
        reason="no controller claimed the recommendation within 300 s; normal scheduling proceeds",
    )
    s.state(released_at + timedelta(seconds=4), 1, "running", "requeued", "PENDING")
    if rec.expires_at is not None:
        s.event(AuditKind.EXPIRED, WATCHDOG, rec.expires_at, 2, recommendation=rec.pk)
    start2 = released_at + timedelta(seconds=66)
    run2 = s.restart(2, nodes, start2, requeued_by="slurm", was="requeued")
    until = b.ago(seconds=b.rng.randint(2, 12))
    progress2 = s.resume(run2, progress1, warm_up=timedelta(minutes=3, seconds=30), until=until)
    s.keep_running(progress2)


def _longctx_thermal(s: _Story) -> None:
    """91423: one GPU in thermal slowdown; recorded only (the straggler policy is record)."""
    b = s.b
    nodes = h100(8)
    run = s.start(nodes, timedelta(minutes=2, seconds=2))
    progress = s.train(
        run,
        _Pace(2.6, 2000, _hf_ckpt("/weka/scratch/okoval/llama3-8b-longctx"), save_seconds=15),
        start=run.started_at + timedelta(minutes=2),
        until=b.ago(seconds=b.rng.randint(2, 12)),
    )
    attempt = s.keep_running(progress)
    line = "            HW Thermal Slowdown           : Active"
    s.anomaly(
        attempt,
        key="straggler-thermal",
        kind=AnomalyKind.STRAGGLER,
        category=FailureCategory.GPU_HARDWARE,
        attribution=Attribution.HARDWARE,
        confidence=0.7,
        severity=Severity.WARNING,
        signature="straggler_rank_throughput",
        evidence_line=line.strip(),
        excerpt=[
            "GPU 00000000:9B:00.0",
            "    Clocks Event Reasons",
            "        Idle                                  : Not Active",
            "        Applications Clocks Setting           : Not Active",
            "        SW Power Cap                          : Not Active",
            "        HW Slowdown                           : Active",
            line,
            "            HW Power Brake Slowdown           : Not Active",
            "        SW Thermal Slowdown                   : Active",
            "    Temperature",
            "        GPU Current Temp                      : 89 C",
        ],
        evidence_at=b.ago(hours=1, minutes=18),
        nodes=nodes,
        ranks=[3],
        details={
            "slowdown_percent": 24,
            "threshold_percent": 20,
            "window_minutes": 10,
            "gpu_temp_c": 89,
            "straggler_action": "record",
        },
        rule="sustained_throughput_drop_with_thermal_slowdown",
    )
