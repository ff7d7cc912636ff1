"""Action mode's canary: only jobs in the chosen partitions and share act without an approval.

A cluster in acknowledged action mode with ``action_partitions`` and/or an
``action_share_percent`` below 100 lets the policy make ready only the recommendations of jobs in
that canary; every other job's recommendation waits for an operator, as in monitor mode. A
controller may claim what the policy made ready only while the job is still in the canary;
what an operator approved stays claimable. Drains wait for a person whenever there is a canary.
The real cluster's side is scenario 17 in tests/e2e/test_scenarios.py.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from recovery.audit.cluster_controls import save_with_audit
from recovery.choices import (
    AuditKind,
    ClusterMode,
    EvidenceSource,
    RecommendationAction,
    RecommendationStatus,
)
from recovery.loop.anomalies import record_anomalies
from recovery.loop.policy import recommend
from recovery.loop.recommendations import approve, claim, claimable_for
from recovery.models import (
    AuditEvent,
    Cluster,
    ControllerToken,
    Node,
    Policy,
    Recommendation,
    Workload,
)
from recovery.models.recommendation import InvalidTransition
from recovery.models.workload import canary_bucket
from tests.factories import (
    AnomalyFactory,
    AttemptFactory,
    ClusterFactory,
    RecommendationFactory,
    WorkloadFactory,
    xid_79,
)

pytestmark = pytest.mark.django_db

NODES = [f"gpu-{n:03d}" for n in range(1, 11)]


def acting(**controls: Any) -> Cluster:
    """An acknowledged action-mode cluster with the given canary settings."""
    cluster: Cluster = ClusterFactory(
        mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True, **controls
    )
    return cluster


def job_ids_in_buckets(below: int, count: int = 1, *, inside: bool = True) -> list[str]:
    """Job ids whose canary bucket is below ``below`` (or at or above it, ``inside=False``)."""
    found = []
    for number in range(100000, 200000):
        job_id = str(number)
        if (canary_bucket(job_id) < below) == inside:
            found.append(job_id)
            if len(found) == count:
                return found
    raise AssertionError("no such job id")


def failed(cluster: Cluster, **workload: Any) -> Recommendation:
    """The policy's recommendation for a crash of a job of ``cluster``."""
    recommendation = recommend(
        AnomalyFactory(workload=WorkloadFactory(cluster=cluster, **workload))
    )
    assert recommendation is not None
    return recommendation


def take(recommendation: Recommendation, controller: str = "controller:c1") -> Recommendation:
    return claim(
        recommendation.pk, controller=controller, instance=str(uuid.uuid4()), lease_seconds=60
    )


def narrow(cluster: Cluster, reason: str = "", **controls: Any) -> list[AuditEvent]:
    for name, value in controls.items():
        setattr(cluster, name, value)
    return save_with_audit(cluster, "ada", cluster.save, reason)


# --- the partitions ---------------------------------------------------------------------------


def test_a_job_in_a_canary_partition_gets_a_ready_recommendation_a_controller_can_claim() -> None:
    """
    GIVEN an acknowledged action-mode cluster whose canary is the partition "canary"
    WHEN a job in that partition, opted in with "act", fails
    THEN the policy makes its recommendation ready, and a controller claims it
    """
    cluster = acting(action_partitions=["canary"])
    recommendation = failed(cluster, partition="canary")

    assert recommendation.status == RecommendationStatus.READY
    assert recommendation.approved_by == ""
    assert list(claimable_for(cluster)) == [recommendation]
    claimed = take(recommendation)
    assert claimed.status == RecommendationStatus.CLAIMED
    event = AuditEvent.objects.get(kind=AuditKind.RECOMMENDED)
    assert event.payload["would_have_done"] is False
    assert event.payload["in_action_scope"] is True


def test_a_job_outside_the_canary_partitions_waits_for_approval() -> None:
    """
    GIVEN an acknowledged action-mode cluster whose canary is the partition "canary"
    WHEN a job in the partition "debug", opted in with "act", fails
    THEN its recommendation awaits approval, as in monitor mode, and nothing can claim it
         until an operator approves it
    """
    cluster = acting(action_partitions=["canary"])
    recommendation = failed(cluster, partition="debug")

    assert recommendation.status == RecommendationStatus.AWAITING_APPROVAL
    assert not recommendation.workload.acts_automatically
    assert recommendation.workload.in_action_scope is False
    event = AuditEvent.objects.get(kind=AuditKind.RECOMMENDED)
    assert (event.payload["mode"], event.payload["would_have_done"]) == ("action", True)
    assert event.payload["in_action_scope"] is False
    assert list(claimable_for(cluster)) == []
    with pytest.raises(InvalidTransition):
        take(recommendation)

    approved = approve(recommendation.pk, operator="otto")
    assert approved.changed and approved.recommendation.status == RecommendationStatus.READY
    assert list(claimable_for(cluster)) == [recommendation]
    assert take(recommendation).status == RecommendationStatus.CLAIMED


def test_several_canary_partitions_each_act_and_no_canary_means_every_partition() -> None:
    cluster = acting(action_partitions=["canary", "gpu-a100"])
    assert failed(cluster, partition="gpu-a100").status == RecommendationStatus.READY
    assert failed(cluster, partition="canary").status == RecommendationStatus.READY
    assert failed(cluster, partition="cpu").status == RecommendationStatus.AWAITING_APPROVAL

    everywhere = acting()
    assert not everywhere.has_canary
    assert failed(everywhere, partition="cpu").status == RecommendationStatus.READY


def test_monitor_mode_with_a_canary_still_waits_for_approval_everywhere() -> None:
    cluster: Cluster = ClusterFactory(mode=ClusterMode.MONITOR, action_partitions=["canary"])
    recommendation = failed(cluster, partition="canary")
    assert recommendation.status == RecommendationStatus.AWAITING_APPROVAL
    assert list(claimable_for(cluster)) == []


# --- the share of jobs ------------------------------------------------------------------------


def test_a_jobs_canary_bucket_comes_from_its_job_id_alone() -> None:
    """
    GIVEN job ids
    WHEN their canary bucket is computed, again, and stored with a workload
    THEN the same job id always gets the same bucket in 0-99, and a share of N % takes about
         N % of 1,000 job ids
    """
    ids = [str(500000 + n) for n in range(1000)]
    buckets = [canary_bucket(job_id) for job_id in ids]
    assert buckets == [canary_bucket(job_id) for job_id in ids]
    assert all(0 <= bucket < 100 for bucket in buckets)
    for share in (10, 25, 50):
        taken = sum(bucket < share for bucket in buckets)
        assert abs(taken - share * 10) <= 60, (share, taken)
    assert sum(bucket < 100 for bucket in buckets) == 1000

    cluster = ClusterFactory()
    first = WorkloadFactory(cluster=cluster, job_id="4242")
    # The same job id submitted again (a new workload of a reused id) lands in the same bucket.
    again = WorkloadFactory(cluster=cluster, job_id="4242")
    assert first.canary_bucket == again.canary_bucket == canary_bucket("4242")
    stored = Workload.objects.get(pk=first.pk)
    assert stored.canary_bucket == canary_bucket("4242")


def test_a_share_of_jobs_picks_which_jobs_act_by_their_bucket() -> None:
    """
    GIVEN an acknowledged action-mode cluster whose canary is 30 % of jobs, no partition named
    WHEN a job whose bucket is below 30 and one whose bucket is not fail
    THEN the first one's recommendation is ready, the second one's awaits approval
    """
    cluster = acting(action_share_percent=30)
    (inside,) = job_ids_in_buckets(30)
    (outside,) = job_ids_in_buckets(30, inside=False)

    in_canary = failed(cluster, job_id=inside)
    out_of_it = failed(cluster, job_id=outside)

    assert in_canary.status == RecommendationStatus.READY
    assert out_of_it.status == RecommendationStatus.AWAITING_APPROVAL
    assert list(claimable_for(cluster)) == [in_canary]


def test_partitions_and_share_both_narrow_the_canary() -> None:
    cluster = acting(action_partitions=["canary"], action_share_percent=30)
    inside, also_inside = job_ids_in_buckets(30, 2)
    (outside,) = job_ids_in_buckets(30, inside=False)
    assert failed(cluster, job_id=inside, partition="canary").status == "ready"
    assert failed(cluster, job_id=also_inside, partition="debug").status == "awaiting_approval"
    assert failed(cluster, job_id=outside, partition="canary").status == "awaiting_approval"


# --- narrowing the canary after the policy made a recommendation ready ------------------------


def test_narrowing_the_canary_stops_what_the_policy_made_ready_not_what_a_person_approved() -> None:
    """
    GIVEN an acknowledged action-mode cluster with no canary, a ready recommendation the policy
          made for a job in "debug", and one an operator approved for another job in "debug"
    WHEN an administrator narrows the canary to the partition "canary"
    THEN the policy's one is no longer claimable (neither listed nor claimed), the approved one
         still is
    """
    cluster = acting()
    by_policy = failed(cluster, partition="debug")
    assert by_policy.status == RecommendationStatus.READY
    by_person = RecommendationFactory(
        workload=WorkloadFactory(cluster=cluster, partition="debug"),
        status=RecommendationStatus.READY,
        approved_by="otto",
    )
    assert set(claimable_for(cluster)) == {by_policy, by_person}

    narrow(cluster, "try it on the canary nodes first", action_partitions=["canary"])

    # A controller's view is read from the stored cluster, not from an object it was given.
    assert list(claimable_for(Cluster.objects.get(pk=cluster.pk))) == [by_person]
    assert list(claimable_for(ClusterFactory.build(pk=cluster.pk))) == [by_person]
    with pytest.raises(InvalidTransition):
        take(by_policy)
    by_policy.refresh_from_db()
    assert by_policy.status == RecommendationStatus.READY
    assert take(by_person).status == RecommendationStatus.CLAIMED


def test_a_smaller_share_stops_a_ready_recommendation_whose_job_left_the_canary() -> None:
    cluster = acting()
    job_id = next(j for j in job_ids_in_buckets(100, 200) if 10 <= canary_bucket(j) < 90)
    recommendation = failed(cluster, job_id=job_id)
    assert recommendation.status == RecommendationStatus.READY

    narrow(cluster, action_share_percent=canary_bucket(job_id))  # the bucket is now outside
    assert list(claimable_for(cluster)) == []
    with pytest.raises(InvalidTransition):
        take(recommendation)

    narrow(cluster, action_share_percent=canary_bucket(job_id) + 1)  # inside again
    assert list(claimable_for(cluster)) == [recommendation]
    assert take(recommendation).status == RecommendationStatus.CLAIMED


def test_a_claimed_recommendation_whose_lease_ran_out_is_not_taken_over_outside_the_canary() -> (
    None
):
    cluster = acting()
    recommendation = failed(cluster, partition="debug")
    Recommendation.objects.filter(pk=recommendation.pk).update(
        status=RecommendationStatus.CLAIMED,
        lease_owner="controller:gone",
        lease_instance="i-gone",
        lease_expires_at=timezone.now() - timedelta(seconds=1),
    )
    narrow(cluster, action_partitions=["canary"])
    assert list(claimable_for(cluster)) == []
    with pytest.raises(InvalidTransition):
        take(recommendation, "controller:c2")


# --- drains -----------------------------------------------------------------------------------


@pytest.fixture
def draining() -> Cluster:
    """An acknowledged action-mode cluster that drains automatically, with ten nodes."""
    cluster = acting(drain_automatically=True)
    Policy.objects.create(name="lab", cluster=cluster, blast_radius_percent=20)
    for name in NODES:
        Node.objects.create(cluster=cluster, name=name, scheduler_state="ALLOCATED")
    return cluster


def kernel_xid(cluster: Cluster, node: str, **workload: Any) -> list[Recommendation]:
    """Xid 79 in ``node``'s kernel log while a job of ``cluster`` runs there: its drains."""
    job = WorkloadFactory(cluster=cluster, **workload)
    assert job.acts_automatically == job.cluster.acts_automatically and job.in_action_scope
    attempt = AttemptFactory(workload=job, nodes=[node])
    record_anomalies(
        job,
        attempt,
        [xid_79(node)],
        timezone.now(),
        scope=f"kernel:{node}",
        source=EvidenceSource.KERNEL_LOG,
    )
    return list(Recommendation.objects.filter(action=RecommendationAction.DRAIN, node__name=node))


def drains_claimable(cluster: Cluster) -> list[Recommendation]:
    """What a controller may claim of the drains (the job's own restart aside)."""
    return [r for r in claimable_for(cluster) if r.action == RecommendationAction.DRAIN]


def test_without_a_canary_an_automatic_drain_is_ready(draining: Cluster) -> None:
    [drain] = kernel_xid(draining, "gpu-002", partition="canary")
    assert drain.status == RecommendationStatus.READY
    assert drains_claimable(draining) == [drain]


@pytest.mark.parametrize(
    "canary",
    [{"action_partitions": ["canary"]}, {"action_share_percent": 100 - 1}],
    ids=["partitions", "share"],
)
def test_a_drain_waits_for_approval_under_a_canary_even_when_drains_are_automatic(
    draining: Cluster, canary: dict[str, Any]
) -> None:
    """
    GIVEN an acknowledged action-mode cluster that drains automatically, with a canary
    WHEN a node's kernel log blames its hardware, under a job inside the canary
    THEN the drain awaits an approval: a drain takes the node from every partition it serves
    """
    narrow(draining, **canary)
    (job_id,) = job_ids_in_buckets(1)  # in every share
    [drain] = kernel_xid(draining, "gpu-003", partition="canary", job_id=job_id)
    assert drain.status == RecommendationStatus.AWAITING_APPROVAL
    assert drains_claimable(draining) == []

    assert approve(drain.pk, operator="otto").changed
    assert drains_claimable(draining) == [drain]


def test_a_ready_drain_made_before_a_canary_was_set_waits_for_a_person(
    draining: Cluster,
) -> None:
    [drain] = kernel_xid(draining, "gpu-004", partition="canary")
    assert drain.status == RecommendationStatus.READY
    narrow(draining, action_partitions=["canary"])
    assert drains_claimable(draining) == []
    with pytest.raises(InvalidTransition):
        take(drain)


# --- the audit trail --------------------------------------------------------------------------


def test_a_change_of_the_canary_is_one_event_with_before_after_and_reason() -> None:
    """
    GIVEN a cluster with no canary
    WHEN an administrator sets both canary settings in one save, with a reason, then saves
         again without changing them
    THEN one ``action_scope_changed`` event names the canary before and after and the reason;
         the second save records nothing
    """
    cluster = acting()
    events = narrow(
        cluster,
        "first week of action mode",
        action_partitions=["canary"],
        action_share_percent=25,
    )
    assert narrow(cluster, "nothing changed", action_partitions=["canary"]) == []

    [event] = AuditEvent.objects.filter(kind=AuditKind.ACTION_SCOPE_CHANGED)
    assert events == [event]
    assert event.actor == "ada"
    assert event.cluster == cluster
    assert event.payload == {
        "from": {"partitions": [], "share_percent": 100},
        "to": {"partitions": ["canary"], "share_percent": 25},
        "reason": "first week of action mode",
    }
    # The canary is not the mode: no other control's event.
    assert AuditEvent.objects.exclude(kind=AuditKind.ACTION_SCOPE_CHANGED).count() == 0

    narrow(cluster, action_partitions=[], action_share_percent=100)
    widened = AuditEvent.objects.filter(kind=AuditKind.ACTION_SCOPE_CHANGED).order_by("pk").last()
    assert widened is not None
    assert widened.payload == {
        "from": {"partitions": ["canary"], "share_percent": 25},
        "to": {"partitions": [], "share_percent": 100},
    }


# --- the Advisor API --------------------------------------------------------------------------


def controller(cluster: Cluster) -> APIClient:
    _, key = ControllerToken.issue(cluster, "slurm-advisor-1")
    client = APIClient()
    client.credentials(
        HTTP_AUTHORIZATION=f"Bearer {key}", HTTP_X_CONTROLLER_INSTANCE=str(uuid.uuid4())
    )
    return client


def test_the_advisor_api_lists_and_lets_claim_only_ready_recommendations_in_the_canary() -> None:
    """
    GIVEN an acknowledged action-mode cluster whose canary is the partition "canary", with
          ready recommendations the policy made for a job in "canary" and, before the canary
          was set, for one in "debug", and one an operator approved for a job in "debug"
    WHEN its controller asks for the recommendations it may claim, and claims each
    THEN the out-of-canary one the policy made is neither listed nor claimable
    """
    cluster = acting()
    before = failed(cluster, partition="debug")
    narrow(cluster, action_partitions=["canary"])
    inside = failed(cluster, partition="canary")
    approved = RecommendationFactory(
        workload=WorkloadFactory(cluster=cluster, partition="debug"),
        status=RecommendationStatus.READY,
        approved_by="otto",
    )
    waiting = failed(cluster, partition="debug")
    assert (before.status, inside.status, waiting.status) == ("ready", "ready", "awaiting_approval")

    client = controller(cluster)
    response = client.get(reverse("api:advisor-ready"))

    assert response.status_code == 200
    listed = [r["id"] for r in response.json()["results"]]
    assert sorted(listed) == sorted([inside.pk, approved.pk])
    for recommendation, expected in ((before, 409), (waiting, 409), (inside, 200), (approved, 200)):
        url = reverse("api:advisor-claim", args=[recommendation.pk])
        answer = client.post(url, {"lease_seconds": 60}, format="json")
        assert answer.status_code == expected, (recommendation.pk, answer.content[:300])
