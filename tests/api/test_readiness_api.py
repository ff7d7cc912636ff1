"""A cluster's readiness over the REST API: the report as JSON, read like the resources."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone
from pytest_django.fixtures import Settings as SettingsWrapper
from rest_framework.test import APIClient

from recovery.choices import RecommendationAction, RecommendationStatus
from recovery.models import ApiToken, Cluster
from tests.factories import ClusterFactory, RecommendationFactory, WorkloadFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_provider(settings: SettingsWrapper) -> None:
    settings.ATTRIBUTION_PROVIDER_URL = ""


@pytest.fixture
def cluster() -> Cluster:
    cluster = ClusterFactory(name="lab", action_partitions=["canary"], action_share_percent=50)
    workload = WorkloadFactory(cluster=cluster)
    created = timezone.now() - timedelta(days=2)
    RecommendationFactory(
        workload=workload,
        action=RecommendationAction.RESTART,
        status=RecommendationStatus.EXECUTED,
        approved_by="otto",
        decided_by="otto",
        created_at=created,
        decided_at=created + timedelta(seconds=120),
    )
    RecommendationFactory(
        workload=workload,
        action=RecommendationAction.RESTART,
        status=RecommendationStatus.REJECTED,
        approved_by="",
        decided_by="otto",
        created_at=created,
        decided_at=created + timedelta(seconds=30),
    )
    return cluster


def url(name: str, query: str = "") -> str:
    return reverse("api:cluster-readiness", args=[name]) + query


def as_user(user: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_it_gives_the_report(cluster: Cluster, viewer: User) -> None:
    response = as_user(viewer).get(url("lab"))
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["cluster"]["name"] == "lab"
    assert body["cluster"]["has_canary"] is True
    assert body["cluster"]["action_scope"] == "partition canary and 50 % of jobs"
    assert body["days"] == 30
    assert body["counts"]["recommended"] == 2
    assert body["counts"]["approved"] == 1
    assert body["counts"]["rejected"] == 1
    assert body["time_to_approval_seconds"] == {"count": 1, "median": 120.0, "p95": 120.0}
    assert body["approval_cost"]["unit"] == "node-hours"
    assert body["agreement_by_action"] == [
        {"key": "restart", "label": "Restart", "approved": 1, "rejected": 1, "rate": 0.5}
    ]
    assert {h["half"] for h in body["halves"]} == {"canary", "monitor"}
    assert body["policy"]["built_in"] is True
    states = {item["key"]: item["state"] for item in body["checklist"]}
    assert states["trial"] == "attention"
    assert states["backups"] == "unknown"
    assert set(states.values()) <= {"ok", "attention", "unknown"}


def test_days_narrow_the_window(cluster: Cluster, viewer: User) -> None:
    body = as_user(viewer).get(url("lab", "?days=1")).json()
    assert body["days"] == 1
    assert body["counts"]["recommended"] == 0


@pytest.mark.parametrize("days", ["0", "366", "abc", "-3", "2.5"])
def test_bad_days_are_400(cluster: Cluster, viewer: User, days: str) -> None:
    response = as_user(viewer).get(url("lab", f"?days={days}"))
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid"
    assert "days" in body["fields"]


def test_an_unknown_cluster_is_404(viewer: User) -> None:
    response = as_user(viewer).get(url("nowhere"))
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


def test_a_personal_token_reads_it(cluster: Cluster, viewer: User) -> None:
    _, key = ApiToken.issue(viewer, "tests")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert client.get(url("lab")).status_code == 200


def test_anonymous_callers_get_401_and_outsiders_403(cluster: Cluster, outsider: User) -> None:
    response = APIClient().get(url("lab"))
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert as_user(outsider).get(url("lab")).status_code == 403


def test_the_schema_documents_it() -> None:
    response = APIClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    operation = response.json()["paths"]["/api/v1/clusters/{cluster_name}/readiness/"]["get"]
    assert operation["tags"] == ["clusters"]
    assert {"200", "400", "401", "403", "404", "429"} <= set(operation["responses"])
    assert operation["responses"]["200"]["content"]["application/json"]["examples"]
    assert {"personalToken": []} in operation["security"]
    days = next(p for p in operation["parameters"] if p["name"] == "days")
    assert (days["schema"]["minimum"], days["schema"]["maximum"]) == (1, 365)
