"""Advisor API lease rules: deadlines hold without the watchdog, reports only from the holder
(refusals audited), renewals for long actions, ``retry`` gives a recommendation back, and a
controller can ask which cluster its token serves."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from recovery.choices import AuditKind, RecommendationStatus
from recovery.models import AuditEvent, Recommendation
from tests.api.test_advisor import EXECUTED, claim, controller, ready_recommendation, report
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db


def renew(client: Any, recommendation: Recommendation, **body: Any) -> Any:
    url = reverse("api:advisor-renew", args=[recommendation.pk])
    return client.post(url, body, format="json")


def test_a_recommendation_past_its_deadline_is_neither_listed_nor_claimable() -> None:
    cluster = ClusterFactory()
    stale = ready_recommendation(cluster, expires_at=timezone.now() - timedelta(seconds=1))
    fresh = ready_recommendation(cluster, expires_at=timezone.now() + timedelta(minutes=5))
    client = controller(cluster)
    listed = client.get(reverse("api:advisor-ready")).json()["results"]
    assert [r["id"] for r in listed] == [fresh.pk]
    response = claim(client, stale)
    assert response.status_code == 409
    assert "past its deadline" in response.json()["error"]
    stale.refresh_from_db()
    assert stale.status == RecommendationStatus.READY
    assert not AuditEvent.objects.filter(kind=AuditKind.CLAIMED).exists()


def test_an_expired_lease_past_the_deadline_is_not_claimed_again() -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(
        cluster,
        status=RecommendationStatus.CLAIMED,
        lease_owner="controller:gone",
        lease_expires_at=timezone.now() - timedelta(seconds=5),
        expires_at=timezone.now() - timedelta(seconds=1),
    )
    assert claim(controller(cluster), recommendation).status_code == 409


def test_the_recommendation_names_the_jobs_user_and_submit_time() -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    body = claim(controller(cluster), recommendation).json()
    assert body["user"] == recommendation.workload.user
    assert body["submit_time"].startswith(recommendation.workload.submit_time.strftime("%Y-%m-%d"))


def test_a_report_after_another_controller_took_over_is_refused_and_audited() -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    slow, fast = controller(cluster, "slow"), controller(cluster, "fast")
    assert claim(slow, recommendation, lease_seconds=10).status_code == 200
    Recommendation.objects.filter(pk=recommendation.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert claim(fast, recommendation).status_code == 200
    response = report(slow, recommendation, **EXECUTED)
    assert response.status_code == 409
    recommendation.refresh_from_db()
    assert (recommendation.status, recommendation.lease_owner) == ("claimed", "controller:fast")
    refused = AuditEvent.objects.get(kind=AuditKind.REPORT_REFUSED)
    assert refused.actor == "controller:slow"
    assert refused.payload["commands"][0]["argv"] == ["scontrol", "requeuehold", "4242"]
    assert "controller:fast" in refused.payload["refused"]
    assert not AuditEvent.objects.filter(kind=AuditKind.SCHEDULER_ACTION).exists()


def test_a_lease_that_ran_out_unclaimed_still_takes_its_holders_report() -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    client = controller(cluster)
    claim(client, recommendation, lease_seconds=10)
    Recommendation.objects.filter(pk=recommendation.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert report(client, recommendation, **EXECUTED).status_code == 200
    assert AuditEvent.objects.filter(kind=AuditKind.SCHEDULER_ACTION).count() == 1


def test_the_holder_renews_its_lease_and_nobody_else_can() -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    holder, other = controller(cluster, "holder"), controller(cluster, "other")
    claim(holder, recommendation, lease_seconds=10)
    before = Recommendation.objects.get(pk=recommendation.pk).lease_expires_at
    response = renew(holder, recommendation, lease_seconds=600)
    assert response.status_code == 200
    after = Recommendation.objects.get(pk=recommendation.pk).lease_expires_at
    assert before is not None and after is not None
    assert after - before > timedelta(seconds=500)
    assert renew(other, recommendation, lease_seconds=600).status_code == 409
    assert renew(holder, recommendation, lease_seconds=1).status_code == 400


def test_a_retry_gives_the_recommendation_back_with_what_was_done() -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    client = controller(cluster)
    claim(client, recommendation)
    half_done = {
        "outcome": "retry",
        "state_before": {"job_state": "RUNNING"},
        "commands": [{"argv": ["scontrol", "requeuehold", "4242"], "returncode": 0}],
        "converged": False,
        "detail": "the SSH connection dropped after requeuehold",
    }
    assert report(client, recommendation, **half_done).status_code == 200
    recommendation.refresh_from_db()
    assert (recommendation.status, recommendation.lease_owner) == ("ready", "")
    event = AuditEvent.objects.get(kind=AuditKind.ACTION_RETRY)
    assert event.payload["commands"][0]["argv"][1] == "requeuehold"
    # Claimable again, by any controller of the cluster.
    assert claim(controller(cluster, "next"), recommendation).status_code == 200


def test_a_controller_learns_which_cluster_its_token_serves() -> None:
    cluster = ClusterFactory(connection_settings={"scheduler_cluster_name": "a100"})
    response = controller(cluster, "ctl-1").get(reverse("api:advisor-identity"))
    assert response.status_code == 200
    assert response.json() == {
        "cluster": cluster.name,
        "scheduler_cluster_name": "a100",
        "actor": "controller:ctl-1",
    }
    plain = ClusterFactory()
    named = controller(plain).get(reverse("api:advisor-identity")).json()
    assert named["scheduler_cluster_name"] == plain.name
