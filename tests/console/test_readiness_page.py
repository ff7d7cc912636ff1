"""The readiness page: the report for every Console role, and the controls for operators."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from pytest_django.fixtures import Settings as SettingsWrapper

from recovery.audit.actors import Actor
from recovery.audit.record import record_event
from recovery.choices import AuditKind, ClusterMode, RecommendationStatus
from recovery.models import AuditEvent, Cluster
from tests.conftest import TEST_PASSWORD
from tests.factories import ClusterFactory, RecommendationFactory, WorkloadFactory

pytestmark = pytest.mark.django_db

CONTROL_KINDS = [
    AuditKind.MODE_CHANGED,
    AuditKind.ACKNOWLEDGEMENT_CHANGED,
    AuditKind.AUTOMATIC_DRAIN_CHANGED,
    AuditKind.ACTION_SCOPE_CHANGED,
]


@pytest.fixture(autouse=True)
def _no_provider(settings: SettingsWrapper) -> None:
    settings.ATTRIBUTION_PROVIDER_URL = ""


def logged_in(user: User, *, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    assert client.login(username=user.username, password=TEST_PASSWORD)
    return client


@pytest.fixture
def cluster() -> Cluster:
    cluster = ClusterFactory(name="lab", last_polled_at=timezone.now())
    workload = WorkloadFactory(cluster=cluster)
    recommendation = RecommendationFactory(
        workload=workload,
        status=RecommendationStatus.EXECUTED,
        approved_by="otto",
        decided_by="otto",
        created_at=timezone.now() - timedelta(hours=2),
        decided_at=timezone.now() - timedelta(hours=2) + timedelta(seconds=90),
    )
    record_event(
        cluster=cluster,
        workload=workload,
        kind=AuditKind.RECOMMENDED,
        actor=Actor.POLICY,
        payload={"recommendation": recommendation.pk, "would_have_done": True},
        occurred_at=recommendation.created_at,
    )
    return cluster


def url(cluster: Cluster, query: str = "") -> str:
    return reverse("console:readiness", args=[cluster.pk]) + query


def control_events(cluster: Cluster) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(cluster=cluster, kind__in=CONTROL_KINDS))


def form(**changes: object) -> dict[str, object]:
    data: dict[str, object] = {
        "mode": ClusterMode.MONITOR,
        "action_partitions": "",
        "action_share_percent": "100",
        "reason": "",
    }
    data.update(changes)
    return {key: value for key, value in data.items() if value is not None}


def test_it_renders_the_report_for_a_viewer(cluster: Cluster, viewer: User) -> None:
    response = logged_in(viewer).get(url(cluster))
    assert response.status_code == 200
    body = response.content.decode()
    assert "Readiness of" in body and "lab" in body
    assert 'data-figure="approved">1<' in body
    assert "median 90 s" in body
    assert 'data-check="trial"' in body and 'data-check="backups" data-state="unknown"' in body
    assert "Only operators can change" in body
    assert '<fieldset class="filters" disabled>' in body


def test_the_clusters_page_links_to_it(cluster: Cluster, viewer: User) -> None:
    body = logged_in(viewer).get(reverse("console:clusters")).content.decode()
    assert f'href="{url(cluster)}"' in body


def test_days_narrow_the_window_and_bad_days_are_refused(cluster: Cluster, viewer: User) -> None:
    client = logged_in(viewer)
    assert client.get(url(cluster, "?days=1")).status_code == 200
    for bad in ("0", "366", "x"):
        response = client.get(url(cluster, f"?days={bad}"))
        assert response.status_code == 400
        assert "days must be" in response.content.decode()


def test_anonymous_readers_log_in_and_outsiders_are_refused(
    cluster: Cluster, outsider: User
) -> None:
    response = Client().get(url(cluster))
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    assert logged_in(outsider).get(url(cluster)).status_code == 403
    assert logged_in(outsider).post(url(cluster), form(reason="x")).status_code == 403


def test_an_unknown_cluster_is_404(viewer: User) -> None:
    assert logged_in(viewer).get("/clusters/999999/readiness/").status_code == 404


def test_an_operator_switches_to_action_mode_with_a_reason(
    cluster: Cluster, operator: User
) -> None:
    client = logged_in(operator)
    page = client.get(url(cluster)).content.decode()
    assert 'id="controls-confirm"' in page  # the checklist is read before switching
    response = client.post(
        url(cluster),
        form(
            mode=ClusterMode.ACTION,
            acknowledge_scheduler_actions="on",
            action_partitions="canary, gpu_long",
            action_share_percent="25",
            reason="trial over: 40 decisions, 95 % agreement",
        ),
        follow=True,
    )
    assert response.status_code == 200
    cluster.refresh_from_db()
    assert cluster.mode == ClusterMode.ACTION
    assert cluster.acknowledge_scheduler_actions
    assert cluster.action_partitions == ["canary", "gpu_long"]
    assert cluster.action_share_percent == 25
    assert not cluster.drain_automatically
    message = response.content.decode()
    assert "Changed on lab: mode monitor to action" in message
    assert "canary share 100 % to 25 %" in message
    events = {e.kind: e for e in control_events(cluster)}
    assert set(events) == {
        AuditKind.MODE_CHANGED,
        AuditKind.ACKNOWLEDGEMENT_CHANGED,
        AuditKind.ACTION_SCOPE_CHANGED,
    }
    for event in events.values():
        assert event.actor == "otto"
        assert event.payload["reason"] == "trial over: 40 decisions, 95 % agreement"
    assert events[AuditKind.MODE_CHANGED].payload["from"] == "monitor"
    assert events[AuditKind.ACTION_SCOPE_CHANGED].payload["to"] == {
        "partitions": ["canary", "gpu_long"],
        "share_percent": 25,
    }


def test_a_change_without_a_reason_changes_nothing(cluster: Cluster, operator: User) -> None:
    response = logged_in(operator).post(url(cluster), form(mode=ClusterMode.ACTION))
    assert response.status_code == 400
    assert "Give a reason" in response.content.decode()
    cluster.refresh_from_db()
    assert cluster.mode == ClusterMode.MONITOR
    assert control_events(cluster) == []


@pytest.mark.parametrize(
    "changes",
    [
        {"action_partitions": "gpu;reboot", "reason": "x"},
        {"action_partitions": "-h", "reason": "x"},
        {"action_share_percent": "0", "reason": "x"},
        {"action_share_percent": "101", "reason": "x"},
        {"mode": "chaos", "reason": "x"},
        {"mode": ClusterMode.ACTION, "reason": "x" * 501},
        {"mode": ClusterMode.ACTION, "reason": "   "},
    ],
)
def test_invalid_input_is_refused_and_changes_nothing(
    cluster: Cluster, operator: User, changes: dict[str, str]
) -> None:
    response = logged_in(operator).post(url(cluster), form(**changes))
    assert response.status_code == 400
    cluster.refresh_from_db()
    assert (cluster.mode, cluster.action_partitions, cluster.action_share_percent) == (
        ClusterMode.MONITOR,
        [],
        100,
    )
    assert control_events(cluster) == []


def test_a_submission_that_changes_nothing_records_nothing(
    cluster: Cluster, operator: User
) -> None:
    response = logged_in(operator).post(url(cluster), form(), follow=True)
    assert "Nothing changed on lab" in response.content.decode()
    assert control_events(cluster) == []


def test_a_viewer_cannot_change_anything(cluster: Cluster, viewer: User) -> None:
    response = logged_in(viewer).post(url(cluster), form(mode=ClusterMode.ACTION, reason="x"))
    assert response.status_code == 403
    cluster.refresh_from_db()
    assert cluster.mode == ClusterMode.MONITOR
    assert control_events(cluster) == []


def test_a_post_without_the_csrf_token_is_refused(cluster: Cluster, operator: User) -> None:
    client = logged_in(operator, csrf=True)
    response = client.post(url(cluster), form(mode=ClusterMode.ACTION, reason="x"))
    assert response.status_code == 403
    cluster.refresh_from_db()
    assert cluster.mode == ClusterMode.MONITOR


def test_a_change_keeps_the_pollers_fields(cluster: Cluster, operator: User) -> None:
    """Only the controls are written: a poll stored meanwhile is not overwritten."""
    client = logged_in(operator)
    polled = timezone.now() + timedelta(seconds=30)
    stale = Cluster.objects.get(pk=cluster.pk)
    Cluster.objects.filter(pk=cluster.pk).update(last_polled_at=polled)
    assert stale.last_polled_at != polled
    client.post(url(cluster), form(drain_automatically="on", reason="drains approved a month"))
    cluster.refresh_from_db()
    assert cluster.drain_automatically
    assert cluster.last_polled_at == polled
