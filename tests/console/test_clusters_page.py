"""The Clusters page: each cluster's mode, what runs degraded, and counts that lead elsewhere."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from pytest_django.fixtures import Settings as SettingsWrapper

from recovery.choices import ClusterMode, Connection, WorkloadState
from recovery.models import Cluster, ControllerToken, Node
from tests.conftest import TEST_PASSWORD
from tests.factories import ClusterFactory, RecommendationFactory, WorkloadFactory

pytestmark = pytest.mark.django_db

URL = "/clusters/"


def logged_in(user: User) -> Client:
    client = Client()
    assert client.login(username=user.username, password=TEST_PASSWORD)
    return client


@pytest.fixture(autouse=True)
def _no_provider(settings: SettingsWrapper) -> None:
    settings.ATTRIBUTION_PROVIDER_URL = ""
    settings.POLL_SECONDS = 5


@pytest.fixture
def clusters() -> dict[str, Cluster]:
    now = timezone.now()
    lab = ClusterFactory(
        name="lab",
        environment="staging",
        last_polled_at=now - timedelta(seconds=2),
    )
    prod = ClusterFactory(
        name="prod",
        connection=Connection.SSH,
        environment="prod",
        mode=ClusterMode.ACTION,
        acknowledge_scheduler_actions=True,
        last_polled_at=now - timedelta(minutes=10),
        last_poll_error="cannot reach slurm-login:22: [Errno 111] Connection refused",
        last_poll_error_at=now - timedelta(seconds=4),
    )
    history = ClusterFactory(
        name="history",
        connection=Connection.SIMULATED,
        connection_settings={"recorded": {"nodes": "gpu-[001-002]", "gpus_per_node": 8}},
    )
    WorkloadFactory.create_batch(2, cluster=lab, state=WorkloadState.RUNNING)
    RecommendationFactory(workload__cluster=prod, workload__state=WorkloadState.REQUEUED)
    Node.objects.create(cluster=lab, name="gpu-007", suspect_since=now)
    Node.objects.create(cluster=prod, name="gpu-101", excluded_until=now + timedelta(hours=1))
    return {"lab": lab, "prod": prod, "history": history}


def test_an_anonymous_visitor_is_sent_to_log_in(clusters: dict[str, Cluster]) -> None:
    response = Client().get(URL)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_a_user_without_a_console_role_is_refused(
    outsider: User, clusters: dict[str, Cluster]
) -> None:
    assert logged_in(outsider).get(URL).status_code == 403


def test_a_viewer_sees_each_cluster_its_mode_and_what_is_degraded(
    viewer: User, clusters: dict[str, Cluster]
) -> None:
    response = logged_in(viewer).get(reverse("console:clusters"))
    assert response.status_code == 200
    body = response.content.decode()
    for name in ("lab", "prod", "history"):
        assert f'id="cluster-{clusters[name].pk}"' in body
    assert "Monitor mode: nothing acts without approval." in body
    assert "Action mode, acknowledged: acts automatically." in body
    assert "SSH" in body and "staging" in body
    # prod: the scheduler cannot be reached, and no controller carries out its actions.
    assert "Scheduler unreachable" in body
    assert "cannot reach slurm-login:22: [Errno 111] Connection refused" in body
    assert "No controller token issued" in body
    assert "not polled: recorded history" in body
    assert "No external attribution provider" in body
    assert 'role="status"' in body
    assert "Polling is late" not in body


def test_counts_link_to_the_fleet_approvals_and_nodes_of_the_cluster(
    viewer: User, clusters: dict[str, Cluster]
) -> None:
    body = logged_in(viewer).get(URL).content.decode()
    assert 'href="/?cluster=lab&amp;state=running"' in body
    assert 'href="/nodes/?cluster=lab&amp;show=suspect"' in body
    assert 'href="/nodes/?cluster=prod&amp;show=excluded"' in body
    assert 'href="/approvals/"' in body
    lab = body[body.index(f'id="cluster-{clusters["lab"].pk}"') :]
    lab = lab[: lab.index("</section>")]
    assert '<span class="cluster-count__n">2</span>' in lab  # running
    prod = body[body.index(f'id="cluster-{clusters["prod"].pk}"') :]
    prod = prod[: prod.index("</section>")]
    assert prod.count('<span class="cluster-count__n">1</span>') == 2  # approval, excluded


def test_the_page_refreshes_itself_when_events_arrive(
    viewer: User, clusters: dict[str, Cluster]
) -> None:
    body = logged_in(viewer).get(URL).content.decode()
    assert 'data-live-url="/ws/live/"' in body
    assert 'id="cluster-list" class="cluster-list" data-live-refresh' in body
    assert "console/clusters.css" in body


def test_admin_links_are_shown_to_staff_only(
    viewer: User, operator: User, site_admin: User, clusters: dict[str, Cluster]
) -> None:
    prod = clusters["prod"]
    change = reverse("admin:recovery_cluster_change", args=[prod.pk])
    policies = f"{reverse('admin:recovery_policy_changelist')}?cluster__id__exact={prod.pk}"
    for user in (viewer, operator):
        body = logged_in(user).get(URL).content.decode()
        assert change not in body
        assert "/admin/" not in body
    body = logged_in(site_admin).get(URL).content.decode()
    assert f'href="{change}"' in body
    assert f'href="{policies}"' in body
    # The filter the link uses is one the policy admin offers.
    assert logged_in(site_admin).get(policies).status_code == 200


def test_with_no_cluster_yet_the_page_says_so(viewer: User) -> None:
    body = logged_in(viewer).get(URL).content.decode()
    assert "No cluster yet." in body


def test_the_queries_do_not_grow_with_the_clusters(viewer: User) -> None:
    client = logged_in(viewer)

    def add_clusters(count: int) -> None:
        now = timezone.now()
        for _ in range(count):
            cluster = ClusterFactory(mode=ClusterMode.ACTION, last_polled_at=now)
            WorkloadFactory(cluster=cluster)
            RecommendationFactory(workload__cluster=cluster)
            Node.objects.create(cluster=cluster, name="gpu-001", suspect_since=now)
            ControllerToken.issue(cluster, "advisor")

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(URL).status_code == 200
        return len(captured)

    add_clusters(2)
    client.get(URL)  # the attribution trail and the session settle on the first visit
    few = queries()
    add_clusters(8)
    assert queries() == few
