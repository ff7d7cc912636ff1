"""The Nodes page lists nodes that need a look, and the workload page flags suspect nodes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from recovery.choices import NodeHealth
from recovery.models import Cluster, Node
from tests.conftest import TEST_PASSWORD
from tests.factories import AttemptFactory, ClusterFactory

pytestmark = pytest.mark.django_db


def logged_in(user: User) -> Client:
    client = Client()
    assert client.login(username=user.username, password=TEST_PASSWORD)
    return client


def node(cluster: Cluster, name: str, **fields: object) -> Node:
    return Node.objects.create(cluster=cluster, name=name, **fields)


@pytest.fixture
def nodes() -> dict[str, Node]:
    now = timezone.now()
    lab = ClusterFactory(name="lab")
    prod = ClusterFactory(name="prod")
    return {
        "suspect": node(
            lab,
            "gpu-007",
            scheduler_state="MIXED",
            health=NodeHealth.SUSPECT,
            times_implicated=3,
            last_implicated_at=now - timedelta(minutes=5),
            suspect_since=now - timedelta(minutes=4),
            suspect_reason="implicated in 3 workloads within 6 h",
        ),
        "unhealthy": node(
            lab,
            "gpu-003",
            scheduler_state="DRAIN",
            state_reason="Kill task failed",
            health=NodeHealth.UNHEALTHY,
        ),
        "excluded": node(prod, "gpu-101", excluded_until=now + timedelta(hours=2)),
        "implicated": node(prod, "gpu-102", times_implicated=1, last_implicated_at=now),
        "fine": node(lab, "gpu-001", scheduler_state="IDLE", health=NodeHealth.HEALTHY),
        "excluded_long_ago": node(lab, "gpu-002", excluded_until=now - timedelta(days=1)),
    }


def test_a_viewer_sees_the_nodes_that_need_a_look(viewer: User, nodes: dict[str, Node]) -> None:
    response = logged_in(viewer).get(reverse("console:nodes"))
    assert response.status_code == 200
    body = response.content.decode()
    for key in ("suspect", "unhealthy", "excluded", "implicated"):
        assert nodes[key].name in body
    assert "gpu-001" not in body
    assert "gpu-002" not in body
    assert "implicated in 3 workloads within 6 h" in body
    assert "Kill task failed" in body
    assert "node-row--suspect" in body
    assert "1 suspect" in body


def test_suspect_nodes_lead_their_cluster(viewer: User, nodes: dict[str, Node]) -> None:
    body = logged_in(viewer).get(reverse("console:nodes")).content.decode()
    assert body.index("gpu-007") < body.index("gpu-003")
    assert body.index(">lab</h2>") < body.index(">prod</h2>")


def test_a_node_only_its_health_calls_suspect_leads_and_is_shown_as_suspect(
    viewer: User, nodes: dict[str, Node]
) -> None:
    lab = nodes["fine"].cluster
    node(lab, "gpu-000", times_implicated=5, last_implicated_at=timezone.now())
    node(lab, "gpu-009", health=NodeHealth.SUSPECT)
    client = logged_in(viewer)
    body = client.get(reverse("console:nodes"), {"cluster": "lab"}).content.decode()
    assert body.index("gpu-007") < body.index("gpu-009") < body.index("gpu-000")
    body = client.get(reverse("console:nodes"), {"show": "suspect"}).content.decode()
    assert "gpu-009" in body
    assert "gpu-000" not in body


def test_it_filters_by_cluster_and_by_flag(viewer: User, nodes: dict[str, Node]) -> None:
    client = logged_in(viewer)
    body = client.get(reverse("console:nodes"), {"cluster": "prod"}).content.decode()
    assert "gpu-101" in body
    assert "gpu-007" not in body
    body = client.get(reverse("console:nodes"), {"show": "suspect"}).content.decode()
    assert "gpu-007" in body
    assert "gpu-003" not in body
    body = client.get(reverse("console:nodes"), {"show": "excluded"}).content.decode()
    assert "gpu-101" in body
    assert "gpu-102" not in body


def test_an_empty_list_says_so(viewer: User) -> None:
    body = logged_in(viewer).get(reverse("console:nodes")).content.decode()
    assert "No node needs a look." in body


def test_the_navigation_links_the_nodes_page(viewer: User) -> None:
    body = logged_in(viewer).get(reverse("console:fleet")).content.decode()
    assert f'href="{reverse("console:nodes")}"' in body


def test_anonymous_users_are_sent_to_log_in() -> None:
    response = Client().get(reverse("console:nodes"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_a_user_without_a_role_is_refused(outsider: User) -> None:
    assert logged_in(outsider).get(reverse("console:nodes")).status_code == 403


def test_the_workload_page_flags_a_suspect_node_of_an_attempt(
    viewer: User, nodes: dict[str, Node]
) -> None:
    lab = Cluster.objects.get(name="lab")
    attempt = AttemptFactory(workload__cluster=lab, nodes=["gpu-001", "gpu-007"])
    body = (
        logged_in(viewer)
        .get(reverse("console:workload", args=[attempt.workload.pk]))
        .content.decode()
    )
    assert body.count("badge--suspect") == 1
    assert "Suspect: implicated in 3 workloads within 6 h" in body


def test_a_suspect_node_of_another_cluster_is_not_flagged(
    viewer: User, nodes: dict[str, Node]
) -> None:
    attempt = AttemptFactory(nodes=["gpu-007"])
    body = (
        logged_in(viewer)
        .get(reverse("console:workload", args=[attempt.workload.pk]))
        .content.decode()
    )
    assert "badge--suspect" not in body


# ---------- health and the Suspect column tell the same thing ----------


def row_of(body: str, node: Node) -> str:
    start = body.rindex("<tr", 0, body.index(f'id="node-{node.pk}"'))
    return body[start : body.index("</tr>", start)]


@pytest.mark.parametrize(
    ("fields", "health_shown", "suspect_text"),
    [
        # Only the health says so (the health layer, an administrator, the demo fleet).
        ({"health": NodeHealth.SUSPECT}, "Suspect", "its health is Suspect"),
        # Only recovery's flag says so: the health agrees with it.
        (
            {
                "health": NodeHealth.HEALTHY,
                "suspect_since": timezone.now() - timedelta(hours=1),
                "suspect_reason": "implicated in 2 workloads within 6 h",
            },
            "Suspect",
            "implicated in 2 workloads within 6 h",
        ),
        # Unhealthy outranks suspect in the health column; the flag still shows.
        (
            {
                "health": NodeHealth.UNHEALTHY,
                "suspect_since": timezone.now() - timedelta(hours=1),
                "suspect_reason": "implicated in 2 workloads within 6 h",
            },
            "Unhealthy",
            "implicated in 2 workloads within 6 h",
        ),
    ],
)
def test_the_suspect_column_agrees_with_the_health(
    viewer: User, fields: dict[str, object], health_shown: str, suspect_text: str
) -> None:
    """
    GIVEN a node one of its records calls suspect
    WHEN a viewer opens the Nodes page
    THEN its health and its Suspect column both say so, and the node counts as suspect
    """
    flagged = node(ClusterFactory(name="lab"), "gpu-a100-012", times_implicated=1, **fields)
    body = logged_in(viewer).get(reverse("console:nodes")).content.decode()
    row = row_of(body, flagged)
    assert f">{health_shown}</span>" in row
    assert '<span class="badge badge--suspect">suspect</span>' in row
    assert suspect_text in row
    assert "node-row--suspect" in row
    assert "1 suspect" in body


def test_a_node_nothing_calls_suspect_has_a_dash_in_the_suspect_column(
    viewer: User, nodes: dict[str, Node]
) -> None:
    body = logged_in(viewer).get(reverse("console:nodes")).content.decode()
    row = row_of(body, nodes["implicated"])
    assert "badge--suspect" not in row
    assert ">Unknown</span>" in row


def test_the_workload_page_flags_a_node_whose_health_is_suspect(viewer: User) -> None:
    lab = ClusterFactory(name="lab")
    node(lab, "gpu-a100-012", health=NodeHealth.SUSPECT)
    attempt = AttemptFactory(workload__cluster=lab, nodes=["gpu-a100-011", "gpu-a100-012"])
    body = (
        logged_in(viewer)
        .get(reverse("console:workload", args=[attempt.workload.pk]))
        .content.decode()
    )
    assert body.count("badge--suspect") == 1
    assert 'title="Suspect: its health is Suspect"' in body
