"""A job Slurm requeued itself (a preemption, an administrator's requeue) is restarting already:
the loop records the notice and takes no action on the job."""

from __future__ import annotations

import pytest

from recovery.choices import (
    AttemptExitState,
    ClusterMode,
    Confirmation,
    FailureCategory,
    RecommendationAction,
    StopReason,
    WorkloadState,
)
from recovery.loop.decision_facts import History
from recovery.loop.policy import recommend
from recovery.loop.policy_rules import decide
from recovery.models import Anomaly, Attempt, Policy, Recommendation
from tests.factories import AnomalyFactory, AttemptFactory, ClusterFactory, WorkloadFactory

pytestmark = pytest.mark.django_db

PREEMPTED = (
    "slurmstepd-gpu-001: error: *** JOB 40001 ON gpu-001 CANCELLED AT {} DUE TO PREEMPTION ***"
)
REQUEUED = (
    "slurmstepd-gpu-001: error: *** JOB 40001 ON gpu-001 CANCELLED AT {} DUE TO JOB REQUEUE ***"
)


def notice(evidence: str, *, requeued: bool) -> Anomaly:
    """Slurm's notice on attempt 1 of an acting job; with ``requeued`` Slurm put the job back in
    its queue (attempt 2 pending), else the attempt ended preempted."""
    cluster = ClusterFactory(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True)
    Policy.objects.create(name="lab", cluster=cluster, blast_radius_percent=100)
    workload = WorkloadFactory(
        cluster=cluster,
        state=WorkloadState.REQUEUED if requeued else WorkloadState.FAILED,
        current_attempt=2 if requeued else 1,
    )
    first = AttemptFactory(
        workload=workload,
        number=1,
        exit_state=AttemptExitState.REQUEUED if requeued else AttemptExitState.PREEMPTED,
    )
    if requeued:
        Attempt.objects.create(workload=workload, number=2)
    return AnomalyFactory(
        workload=workload,
        attempt=first,
        category=FailureCategory.SCHEDULER_EVENT,
        attribution="system_software",
        signature="slurm-preempted",
        evidence_line=evidence.format("2026-12-04T04:38:23"),
        implicated_nodes=["gpu-001"],
        confirmation=Confirmation.CONFIRMED,
    )


@pytest.mark.parametrize("evidence", [PREEMPTED, REQUEUED], ids=["preemption", "requeue"])
def test_a_job_slurm_requeued_itself_is_neither_restarted_nor_stopped(evidence: str) -> None:
    """Found by the soak: after a preemption or an administrator's scontrol requeue, the loop
    recommended a restart of the job Slurm had already put back in its queue, and a controller
    held it, set its exclusions and released it; with no checkpoint since, it could have stopped
    the healthy job."""
    anomaly = notice(evidence, requeued=True)
    history = History(attempts=3, attempts_without_checkpoint=3)
    decision = decide(anomaly, Policy(max_attempts_without_checkpoint=3), history)
    assert decision.action == RecommendationAction.NONE
    assert decision.stop_reason == ""
    assert recommend(anomaly) is None
    assert not Recommendation.objects.exists()


def test_a_preempted_job_slurm_did_not_requeue_is_still_restarted() -> None:
    anomaly = notice(PREEMPTED, requeued=False)
    decision = decide(anomaly, Policy(), History(attempts=1, attempts_without_checkpoint=0))
    assert decision.action in {RecommendationAction.RESTART, RecommendationAction.RESTART_EXCLUDING}
    assert decision.stop_reason != StopReason.NO_CHECKPOINT
