"""The approval queue tells how the crash behind a recommendation was confirmed."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from recovery.choices import AnomalyKind, ClusterMode, Confirmation, OptInMode
from tests.conftest import TEST_PASSWORD
from tests.factories import AnomalyFactory, ClusterFactory, RecommendationFactory, WorkloadFactory

pytestmark = pytest.mark.django_db


def logged_in(user: User) -> Client:
    client = Client()
    assert client.login(username=user.username, password=TEST_PASSWORD)
    return client


def test_a_recommendation_shows_its_crashs_confirmation(viewer: User) -> None:
    """GIVEN a recommendation for a stalled crash and one for a hang
    WHEN a viewer opens the approval queue
    THEN the stalled crash is badged as such, and the hang has no confirmation badge
    """
    stalled = AnomalyFactory(confirmation=Confirmation.STALLED)
    hang = AnomalyFactory(kind=AnomalyKind.HANG)
    RecommendationFactory(workload=stalled.workload, anomaly=stalled)
    RecommendationFactory(workload=hang.workload, anomaly=hang)

    body = logged_in(viewer).get(reverse("console:approvals")).content.decode()

    assert body.count('class="badge confirmation-') == 1
    assert (
        '<span class="badge confirmation-stalled"'
        ' title="Stalled (no exit, no progress: handled as a hang)">Stalled</span>'
    ) in body


def test_the_job_and_the_cluster_say_why_a_recommendation_waits(viewer: User) -> None:
    """GIVEN an acknowledged action-mode cluster and a job on it opted in to be observed
    WHEN a viewer opens the approval queue and the job's page
    THEN both say the job's mode holds its actions for approval, and the cluster's mode beside it
    """
    cluster = ClusterFactory(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True)
    observed = WorkloadFactory(cluster=cluster, opt_in_mode=OptInMode.OBSERVE)
    acting = WorkloadFactory(cluster=cluster)
    RecommendationFactory(workload=observed)
    client = logged_in(viewer)

    queue = client.get(reverse("console:approvals")).content.decode()
    assert "action mode" in queue
    assert "its owner asked for observation: acts only on approval" in queue

    page = client.get(reverse("console:workload", args=[observed.pk])).content.decode()
    assert "acts only on approval, whatever the cluster's mode" in page
    page = client.get(reverse("console:workload", args=[acting.pk])).content.decode()
    assert "the cluster's mode decides: acts automatically" in page


def test_each_excluded_node_says_where_it_came_from(viewer: User) -> None:
    recommendation = RecommendationFactory(
        excluded_nodes=["gpu-003", "gpu-007"],
        exclusion_sources={"gpu-003": "cluster: unhealthy", "gpu-007": "implicated"},
    )
    queue = logged_in(viewer).get(reverse("console:approvals")).content.decode()
    assert 'gpu-003 <span class="muted">(cluster: unhealthy)</span>' in queue
    page = (
        logged_in(viewer)
        .get(reverse("console:workload", args=[recommendation.workload.pk]))
        .content.decode()
    )
    assert 'gpu-007 <span class="muted">(implicated)</span>' in page
