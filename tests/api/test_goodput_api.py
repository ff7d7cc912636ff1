"""Goodput figures over the REST API: per workload and per cluster, for Console roles only."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from recovery.choices import AuditKind, WorkloadState
from tests.conftest import TEST_PASSWORD
from tests.factories import ClusterFactory, WorkloadFactory
from tests.read.test_goodput import failed_once_and_recovered, trail

pytestmark = pytest.mark.django_db


def logged_in(user: User) -> Client:
    client = Client()
    assert client.login(username=user.username, password=TEST_PASSWORD)
    return client


def test_it_gives_a_workloads_figures(viewer: User) -> None:
    workload = failed_once_and_recovered(ClusterFactory(name="lab"))
    response = logged_in(viewer).get(reverse("api:workload-goodput", args=[workload.pk]))
    assert response.status_code == 200
    body = response.json()
    assert body["workload"] == {
        "id": workload.pk,
        "cluster": "lab",
        "job_id": workload.job_id,
        "name": workload.name,
        "state": "completed",
    }
    assert body["ettr"] == pytest.approx(0.93)
    assert body["wall_seconds"] == 1000
    assert body["unproductive_seconds"] == 70
    assert body["failure_count"] == 1
    assert body["detection_latency_seconds"] == {"count": 1, "median": 2.0, "p95": 2.0}
    assert body["action_latency_seconds"]["median"] == 3
    assert body["time_to_productive_seconds"]["median"] == 80
    assert body["work_lost_seconds"]["median"] == 50
    (failure,) = body["failures"]
    assert failure["attempt"] == 1
    assert failure["at"].startswith("2026-11-29T10:04:10")
    assert failure["work_lost_seconds"] == 50


def test_unknown_figures_are_null(viewer: User) -> None:
    never_ran = WorkloadFactory(state=WorkloadState.PENDING)
    body = logged_in(viewer).get(reverse("api:workload-goodput", args=[never_ran.pk])).json()
    assert body["ettr"] is None
    assert body["failure_count"] == 0
    assert body["action_latency_seconds"] == {"count": 0, "median": None, "p95": None}
    assert body["failures"] == []


def test_it_gives_a_clusters_figures(viewer: User) -> None:
    cluster = ClusterFactory(name="lab")
    failed_once_and_recovered(cluster)
    healthy = WorkloadFactory(cluster=cluster, state=WorkloadState.COMPLETED)
    trail(
        healthy,
        [
            (0, AuditKind.STATE_CHANGED, 1, {"to": "running"}),
            (1000, AuditKind.TRAINING_COMPLETED, 1, {}),
        ],
    )
    response = logged_in(viewer).get(reverse("api:cluster-goodput", args=[cluster.pk]))
    assert response.status_code == 200
    body = response.json()
    assert body["cluster"] == {"id": cluster.pk, "name": "lab"}
    assert body["workload_count"] == 2
    assert body["failure_count"] == 1
    assert body["ettr"] == pytest.approx((2000 - 70) / 2000)
    assert body["detection_latency_seconds"]["median"] == 2
    assert body["time_to_productive_seconds"] == {"count": 1, "median": 80.0, "p95": 80.0}


def test_a_cluster_counts_workloads_given_up_apart_from_those_that_failed(viewer: User) -> None:
    cluster = ClusterFactory(name="lab")
    for state, count in ((WorkloadState.STOPPED, 2), (WorkloadState.FAILED, 1)):
        for _ in range(count):
            ended = WorkloadFactory(cluster=cluster, state=state)
            trail(ended, [(0, AuditKind.STATE_CHANGED, 1, {"to": "running"})])
    body = logged_in(viewer).get(reverse("api:cluster-goodput", args=[cluster.pk])).json()
    assert (body["given_up_count"], body["failed_count"], body["workload_count"]) == (2, 1, 3)


@pytest.mark.parametrize("name", ["api:workload-goodput", "api:cluster-goodput"])
def test_an_unknown_id_is_a_json_404(viewer: User, name: str) -> None:
    response = logged_in(viewer).get(reverse(name, args=[999999]))
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert "detail" in response.json()


@pytest.mark.parametrize("name", ["api:workload-goodput", "api:cluster-goodput"])
def test_anonymous_callers_are_refused(name: str) -> None:
    workload = WorkloadFactory()
    target = workload.pk if name == "api:workload-goodput" else workload.cluster.pk
    response = Client().get(reverse(name, args=[target]))
    assert response.status_code == 403
    assert "ettr" not in response.json()


@pytest.mark.parametrize("name", ["api:workload-goodput", "api:cluster-goodput"])
def test_a_user_without_a_role_is_refused(outsider: User, name: str) -> None:
    workload = WorkloadFactory()
    target = workload.pk if name == "api:workload-goodput" else workload.cluster.pk
    response = logged_in(outsider).get(reverse(name, args=[target]))
    assert response.status_code == 403


def test_the_schema_documents_the_goodput_endpoints_with_examples() -> None:
    response = Client().get(reverse("api:schema"), HTTP_ACCEPT="application/vnd.oai.openapi+json")
    paths = response.json()["paths"]
    for path in (
        "/api/v1/workloads/{workload_id}/goodput/",
        "/api/v1/clusters/{cluster_id}/goodput/",
    ):
        operation = paths[path]["get"]
        assert {"200", "403", "404"} <= set(operation["responses"])
        assert "examples" in operation["responses"]["200"]["content"]["application/json"]
