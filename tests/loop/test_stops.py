"""A stop is a stop: the workload ends STOPPED, with a ``stopped`` event saying why.

The controller's report arrives through the same function the Advisor API calls; the scheduler
is scripted (the real Slurm path is e2e scenario 5).
"""

from __future__ import annotations

import pytest

from recovery.choices import (
    AuditKind,
    ClusterMode,
    RecommendationAction,
    RecommendationStatus,
    StopReason,
    WorkloadState,
)
from recovery.loop.policy import recommend
from recovery.loop.poll import poll_cluster
from recovery.loop.recommendations import ActionReport, claim, report
from recovery.models import AuditEvent, Cluster, Policy, Recommendation, Workload
from tests.factories import AnomalyFactory, ClusterFactory
from tests.fakes import Scripted, job

pytestmark = pytest.mark.django_db

CONTROLLER = "controller:lab"
INSTANCE = "3b4a1a60-6f59-4a57-9d0e-6f2f1c1a9e01"


def stopped_job_report(converged: bool = True) -> ActionReport:
    return ActionReport(
        outcome=RecommendationStatus.EXECUTED,
        state_before={"state": "FAILED"},
        commands=[{"argv": ["scancel", "4242"], "returncode": 0, "output": ""}],
        converged=converged,
    )


def stop_after_the_budget() -> tuple[Cluster, Workload, Recommendation]:
    """A job whose one allowed attempt failed, and the stop the policy recommends for it."""
    cluster = ClusterFactory(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True)
    Policy.objects.create(name="lab", cluster=cluster, max_attempts=1, blast_radius_percent=100)
    poll_cluster(cluster, Scripted([job(state="FAILED")]))
    workload = Workload.objects.get(cluster=cluster)
    stop = recommend(AnomalyFactory(workload=workload, attempt=workload.attempts.get()))
    assert stop is not None and stop.action == RecommendationAction.STOP
    return cluster, workload, stop


def test_an_executed_stop_leaves_the_workload_stopped_with_its_reason() -> None:
    """
    GIVEN a job whose attempts used up the policy's budget, and the stop carried out
    WHEN the controller reports it converged, twice (a lost reply), and polls see it CANCELLED
    THEN the workload is STOPPED once, with one ``stopped`` event naming the reason
    """
    cluster, workload, stop = stop_after_the_budget()
    assert stop.stop_reason == StopReason.RETRY_BUDGET

    claim(stop.pk, controller=CONTROLLER, instance=INSTANCE, lease_seconds=60)
    report(stop.pk, controller=CONTROLLER, instance=INSTANCE, result=stopped_job_report())
    report(stop.pk, controller=CONTROLLER, instance=INSTANCE, result=stopped_job_report())
    for _ in range(2):
        poll_cluster(cluster, Scripted([job(state="CANCELLED", reason="None")]))

    workload.refresh_from_db()
    assert workload.state == WorkloadState.STOPPED
    assert workload.state_reason.startswith("Stopped by recovery: ")
    (stopped,) = AuditEvent.objects.filter(workload=workload, kind=AuditKind.STOPPED)
    assert stopped.payload["stop_reason"] == StopReason.RETRY_BUDGET
    assert stopped.payload["recommendation"] == stop.pk
    assert (
        AuditEvent.objects.filter(
            workload=workload, kind=AuditKind.STATE_CHANGED, payload__to=WorkloadState.STOPPED
        ).count()
        == 1
    )
    assert recommend(AnomalyFactory(workload=workload, attempt=workload.attempts.get())) is None


def test_a_stop_that_did_not_take_hold_leaves_the_state_to_the_scheduler() -> None:
    _, workload, stop = stop_after_the_budget()
    claim(stop.pk, controller=CONTROLLER, instance=INSTANCE, lease_seconds=60)
    report(
        stop.pk,
        controller=CONTROLLER,
        instance=INSTANCE,
        result=stopped_job_report(converged=False),
    )

    workload.refresh_from_db()
    assert workload.state == WorkloadState.FAILED
    assert not AuditEvent.objects.filter(kind=AuditKind.STOPPED).exists()


def test_a_person_restarting_a_stopped_job_brings_it_back() -> None:
    cluster, workload, stop = stop_after_the_budget()
    claim(stop.pk, controller=CONTROLLER, instance=INSTANCE, lease_seconds=60)
    report(stop.pk, controller=CONTROLLER, instance=INSTANCE, result=stopped_job_report())

    poll_cluster(cluster, Scripted([job(state="RUNNING", restart_count=1)]))
    workload.refresh_from_db()
    assert workload.state == WorkloadState.RUNNING
