"""The watchdog: held jobs are released after the decision timeout, stale ready advice expires.

The scheduler here is scripted; tests/slurm/test_watchdog.py releases a real held Slurm job.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from django.utils import timezone

from recovery.audit.record import record_event
from recovery.choices import AuditKind, Disposition, RecommendationStatus, WorkloadState
from recovery.loop.recommendations import approve
from recovery.loop.watchdog import run_watchdog
from recovery.models import AuditEvent, ControllerToken, Policy, Recommendation
from recovery.read.queries import unacknowledged_abandoned
from recovery.schedulers.base import CommandResult
from tests.factories import ClusterFactory, RecommendationFactory, WorkloadFactory
from tests.fakes import Scripted, job

pytestmark = pytest.mark.django_db


class Releasing(Scripted):
    def __init__(self, reason: str = "job_requeued_in_held_state") -> None:
        super().__init__([job(state="PENDING", held=True, reason=reason, nodes=[])])
        self.released: list[str] = []
        self.excluded: list[list[str]] = []

    def set_excluded_nodes(self, job_id: str, nodes: list[str]) -> CommandResult:  # type: ignore[override]
        self.excluded.append(list(nodes))
        self.jobs = [replace(self.jobs[0], excluded_nodes=list(nodes))]
        return CommandResult(
            ("scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(nodes)}"), 0, "", ""
        )

    def release(self, job_id: str) -> CommandResult:  # type: ignore[override]
        self.released.append(job_id)
        self.jobs = [replace(self.jobs[0], held=False, reason="BeginTime")]
        return CommandResult(("scontrol", "release", job_id), 0, "", "")


def held_workload(minutes_ago: float, held_from: str = "running"):  # type: ignore[no-untyped-def]
    cluster = ClusterFactory()
    workload = WorkloadFactory(cluster=cluster, job_id="4242", state=WorkloadState.HELD)
    record_event(
        cluster=cluster,
        workload=workload,
        kind=AuditKind.STATE_CHANGED,
        actor="poller",
        payload={"from": held_from, "to": "held"},
        occurred_at=timezone.now() - timedelta(minutes=minutes_ago),
    )
    return cluster, workload


def test_a_job_held_past_the_decision_timeout_is_released_once() -> None:
    cluster, workload = held_workload(minutes_ago=6)  # the default timeout is 5 minutes
    scheduler = Releasing()
    assert run_watchdog(adapters={cluster.pk: scheduler}).released == 1
    assert run_watchdog(adapters={cluster.pk: scheduler}).released == 0
    assert scheduler.released == ["4242"]
    event = AuditEvent.objects.get(kind=AuditKind.WATCHDOG_RELEASED)
    assert (event.actor, event.workload) == ("watchdog", workload)
    assert event.payload["decision_timeout_seconds"] == 300
    assert event.payload["command"]["argv"] == ["scontrol", "release", "4242"]


def test_a_job_held_shorter_than_its_policy_allows_stays_held() -> None:
    cluster, _ = held_workload(minutes_ago=6)
    Policy.objects.create(name="patient", cluster=cluster, decision_timeout_seconds=600)
    scheduler = Releasing()
    assert run_watchdog(adapters={cluster.pk: scheduler}).released == 0
    assert scheduler.released == []


def test_a_hold_on_a_job_waiting_to_start_is_never_released() -> None:
    cluster, _ = held_workload(minutes_ago=60, held_from="pending")
    scheduler = Releasing(reason="JobHeldUser")
    assert run_watchdog(adapters={cluster.pk: scheduler}).released == 0


def test_a_controller_with_a_live_lease_keeps_its_hold() -> None:
    cluster, workload = held_workload(minutes_ago=60)
    RecommendationFactory(
        workload=workload,
        status=RecommendationStatus.CLAIMED,
        lease_owner="ctl",
        lease_expires_at=timezone.now() + timedelta(seconds=60),
    )
    assert run_watchdog(adapters={cluster.pk: Releasing()}).released == 0


def test_a_release_keeps_out_the_nodes_the_restart_was_to_avoid() -> None:
    cluster, workload = held_workload(minutes_ago=60)
    # The controller that held the job died before setting the exclusion; its lease ran out.
    RecommendationFactory(
        workload=workload,
        excluded_nodes=["gpu-002"],
        status=RecommendationStatus.CLAIMED,
        lease_owner="ctl",
        lease_expires_at=timezone.now() - timedelta(seconds=1),
    )
    scheduler = Releasing()
    scheduler.jobs = [replace(scheduler.jobs[0], excluded_nodes=["gpu-009"])]
    assert run_watchdog(adapters={cluster.pk: scheduler}).released == 1
    assert scheduler.excluded == [["gpu-002", "gpu-009"]]  # the job's own exclusion is kept
    assert scheduler.released == ["4242"]
    event = AuditEvent.objects.get(kind=AuditKind.WATCHDOG_RELEASED)
    assert event.payload["excluded_nodes"] == ["gpu-002"]
    assert [c["argv"][1] for c in event.payload["commands"]] == ["update", "release"]
    # Each command was written into the trail before it ran, with the argv it ran.
    dispatched = AuditEvent.objects.filter(kind=AuditKind.DISPATCHED).order_by("id")
    assert [d.payload["argv"] for d in dispatched] == [c["argv"] for c in event.payload["commands"]]
    assert {d.actor for d in dispatched} == {"watchdog"}
    assert all(d.pk < event.pk for d in dispatched)


class DyingAfterRelease(Releasing):
    """The worker running the watchdog is killed right after the release took effect."""

    def release(self, job_id: str) -> CommandResult:  # type: ignore[override]
        super().release(job_id)
        raise KeyboardInterrupt("worker killed")


def test_a_watchdog_killed_after_its_release_leaves_the_release_in_the_trail() -> None:
    """Found while checking the chaos run's audit-gap count: the watchdog recorded its
    commands only after running them, so a worker killed in between left a release the
    scheduler carried out with no event naming it."""
    cluster, _ = held_workload(minutes_ago=60)
    scheduler = DyingAfterRelease()
    with pytest.raises(KeyboardInterrupt):
        run_watchdog(adapters={cluster.pk: scheduler})
    assert scheduler.released == ["4242"]
    assert not AuditEvent.objects.filter(kind=AuditKind.WATCHDOG_RELEASED).exists()
    dispatched = AuditEvent.objects.get(kind=AuditKind.DISPATCHED)
    assert dispatched.payload["argv"] == ["scontrol", "release", "4242"]


def test_a_hold_whose_exclusions_cannot_be_read_is_not_released() -> None:
    cluster, workload = held_workload(minutes_ago=60)
    RecommendationFactory(workload=workload, status=RecommendationStatus.FAILED)
    scheduler = Releasing()
    scheduler.jobs = [
        replace(
            scheduler.jobs[0],
            excluded_nodes=None,
            unreadable={"excluded_nodes": "the fixed-format squeue output has no exclusions"},
        )
    ]
    summary = run_watchdog(adapters={cluster.pk: scheduler})
    assert summary.released == 0
    assert scheduler.released == []
    assert "fixed-format" in summary.errors[0]


def test_it_keeps_working_when_the_policy_engine_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster, workload = held_workload(minutes_ago=6)
    stale = RecommendationFactory(
        workload=workload,
        status=RecommendationStatus.READY,
        expires_at=timezone.now() - timedelta(seconds=1),
    )

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("policy engine exploded")

    monkeypatch.setattr("recovery.loop.policy.policy_for", broken)
    monkeypatch.setattr("recovery.loop.policy_rules.decide", broken)
    summary = run_watchdog(adapters={cluster.pk: Releasing()})
    assert (summary.released, summary.expired) == (1, 1)
    stale.refresh_from_db()
    assert stale.status == RecommendationStatus.EXPIRED


def test_ready_advice_nobody_executed_expires_and_the_rest_is_left_alone() -> None:
    now = timezone.now()
    past = now - timedelta(seconds=1)
    stale = RecommendationFactory(status=RecommendationStatus.READY, expires_at=past)
    fresh = RecommendationFactory(
        status=RecommendationStatus.READY, expires_at=now + timedelta(minutes=5)
    )
    waiting = RecommendationFactory(status=RecommendationStatus.AWAITING_APPROVAL, expires_at=past)
    claimed = RecommendationFactory(status=RecommendationStatus.CLAIMED, expires_at=past)
    assert run_watchdog().expired == 1
    assert run_watchdog().expired == 0
    statuses = {
        r.pk: r.status
        for r in Recommendation.objects.filter(pk__in=[stale.pk, fresh.pk, waiting.pk, claimed.pk])
    }
    assert statuses == {
        stale.pk: RecommendationStatus.EXPIRED,
        fresh.pk: RecommendationStatus.READY,
        waiting.pk: RecommendationStatus.AWAITING_APPROVAL,
        claimed.pk: RecommendationStatus.CLAIMED,
    }
    event = AuditEvent.objects.get(kind=AuditKind.EXPIRED)
    assert (event.actor, event.payload["recommendation"]) == ("watchdog", stale.pk)


def test_an_approval_gives_the_advice_its_full_time_to_be_executed() -> None:
    created = timezone.now() - timedelta(hours=2)
    recommendation = RecommendationFactory(
        created_at=created, expires_at=created + timedelta(minutes=30)
    )
    approve(recommendation.pk, operator="olivia")
    recommendation.refresh_from_db()
    assert recommendation.expires_at is not None
    remaining = recommendation.expires_at - timezone.now()
    assert timedelta(minutes=29) < remaining <= timedelta(minutes=30)
    assert run_watchdog().expired == 0


def test_an_approved_recommendation_nobody_claimed_is_an_abandoned_action_with_its_reason() -> None:
    now = timezone.now()
    approved = RecommendationFactory(
        status=RecommendationStatus.READY,
        approved_by="olivia",
        expires_at=now - timedelta(seconds=1),
        workload__cluster__name="live-monitor",
    )
    by_policy = RecommendationFactory(
        status=RecommendationStatus.READY, approved_by="", expires_at=now - timedelta(seconds=1)
    )
    token, _ = ControllerToken.issue(approved.workload.cluster, "login-node-1")
    ControllerToken.objects.filter(pk=token.pk).update(last_used_at=now - timedelta(minutes=12))

    assert run_watchdog().expired == 2

    approved.refresh_from_db()
    assert approved.status == RecommendationStatus.EXPIRED
    assert approved.disposition == Disposition.ABANDONED
    assert approved.disposition_reason == (
        "approved by olivia but not claimed before its deadline: no controller of live-monitor "
        "has called in for 12 min; nothing was done to the job"
    )
    assert list(unacknowledged_abandoned()) == [approved]
    event = AuditEvent.objects.get(kind=AuditKind.EXPIRED, payload__recommendation=approved.pk)
    assert event.payload["abandoned"] is True
    assert event.payload["reason"] == approved.disposition_reason
    # Ready by the policy's own decision (action mode): the cluster's controller warning says it.
    by_policy.refresh_from_db()
    assert (by_policy.status, by_policy.disposition) == (RecommendationStatus.EXPIRED, "")


def test_an_approval_on_a_cluster_whose_controllers_never_called_in_says_so() -> None:
    recommendation = RecommendationFactory(
        status=RecommendationStatus.READY,
        approved_by="olivia",
        expires_at=timezone.now() - timedelta(seconds=1),
        workload__cluster__name="lab",
    )
    run_watchdog()
    recommendation.refresh_from_db()
    assert "no controller of lab has ever called in" in recommendation.disposition_reason
