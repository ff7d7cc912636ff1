"""Training that goes on but diverged, or a whole job that slowed down, while it still runs.

A divergence leads to what the policy says (record, stop, or restart from a checkpoint saved
before it began), always awaiting an operator's approval: the job is still training. A slowdown
is recorded.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from recovery.choices import (
    NODE_ACTIONS,
    AnomalyKind,
    ClusterMode,
    DivergenceAction,
    RecommendationAction,
    RecommendationStatus,
    StopReason,
)
from recovery.loop.monitors import check_progress
from recovery.models import Attempt, Policy, ProgressSample, Recommendation, Workload
from tests.factories import AttemptFactory, ClusterFactory, WorkloadFactory

pytestmark = pytest.mark.django_db


def samples(
    workload: Workload,
    attempt: Attempt,
    now: datetime,
    *,
    losses: list[float],
    throughputs: list[float] | None = None,
) -> None:
    """One progress sample a minute per value, the last one a minute ago."""
    count = len(losses)
    ProgressSample.objects.bulk_create(
        ProgressSample(
            workload=workload,
            attempt=attempt.number,
            rank=0,
            node="gpu-001",
            step=1000 + 10 * index,
            loss=loss,
            throughput=throughputs[index] if throughputs else None,
            at=now - timedelta(minutes=count - index),
        )
        for index, loss in enumerate(losses)
    )


def running(action: str, **policy: object) -> tuple[Workload, Attempt, datetime]:
    cluster = ClusterFactory(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True)
    Policy.objects.create(
        name="divergence",
        cluster=cluster,
        straggler_window_minutes=5,
        divergence_action=action,
        blast_radius_percent=100,
        **policy,
    )
    now = timezone.now()
    workload = WorkloadFactory(cluster=cluster)
    attempt = AttemptFactory(workload=workload, started_at=now - timedelta(hours=1))
    return workload, attempt, now


DIVERGED = [2.1, 2.0, 2.05, 1.98, 2.02] * 4 + [6.3, 6.1, 6.4, 6.2, 6.0, 6.5]


def job_recommendations() -> list[Recommendation]:
    return list(Recommendation.objects.exclude(action__in=NODE_ACTIONS))


def test_a_loss_that_jumped_and_stayed_up_is_recorded_as_a_divergence() -> None:
    workload, attempt, now = running(DivergenceAction.RECORD)
    samples(workload, attempt, now, losses=DIVERGED)
    (divergence,) = check_progress(workload, now)
    assert (divergence.kind, divergence.category, divergence.signature) == (
        AnomalyKind.DIVERGENCE,
        "nan_divergence",
        "loss-spike",
    )
    assert divergence.details["since_step"] == 1000 + 10 * 20
    assert job_recommendations() == []
    assert check_progress(workload, now + timedelta(seconds=30)) == []  # recorded once


def test_a_policy_that_stops_diverged_runs_waits_for_an_operator() -> None:
    workload, attempt, now = running(DivergenceAction.STOP)
    samples(workload, attempt, now, losses=DIVERGED)
    check_progress(workload, now)
    (stop,) = job_recommendations()
    assert (stop.action, stop.stop_reason) == (RecommendationAction.STOP, StopReason.DIVERGED)
    # The cluster acts on its own, but the job is still training: a person decides.
    assert stop.status == RecommendationStatus.AWAITING_APPROVAL


@pytest.mark.parametrize(
    ("checkpoint", "action"),
    [(1100, RecommendationAction.RESTART), (1250, None), (None, None)],
)
def test_a_restart_is_proposed_only_from_a_checkpoint_saved_before_the_divergence(
    checkpoint: int | None, action: str | None
) -> None:
    workload, attempt, now = running(DivergenceAction.RESTART)
    Workload.objects.filter(pk=workload.pk).update(last_checkpoint_step=checkpoint)
    workload.refresh_from_db()
    samples(workload, attempt, now, losses=DIVERGED)
    assert len(check_progress(workload, now)) == 1
    found = job_recommendations()
    if action is None:
        assert found == []
    else:
        (restart,) = found
        assert restart.action == action
        assert restart.status == RecommendationStatus.AWAITING_APPROVAL
        assert "checkpoint of step 1100" in restart.reason and "step 1200" in restart.reason


def test_a_whole_job_slower_than_it_was_is_recorded_as_a_slowdown() -> None:
    workload, attempt, now = running(DivergenceAction.STOP)
    steady = [2.0] * 26
    rates = [4000.0] * 20 + [800.0] * 6
    samples(workload, attempt, now, losses=steady, throughputs=rates)
    (slowdown,) = check_progress(workload, now)
    assert (slowdown.kind, slowdown.signature) == (AnomalyKind.SLOWDOWN, "throughput-collapse")
    assert job_recommendations() == []
