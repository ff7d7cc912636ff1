"""Drains in the Console: what the approvals page shows of one, and the Nodes page's resume."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from recovery.choices import (
    DRAIN_REASON_PREFIX,
    AuditKind,
    RecommendationAction,
    RecommendationStatus,
)
from recovery.models import AuditEvent, Node, Policy, Recommendation
from tests.conftest import TEST_PASSWORD
from tests.factories import ClusterFactory, RecommendationFactory, WorkloadFactory

pytestmark = pytest.mark.django_db

REASON = f"{DRAIN_REASON_PREFIX} hardware: gpu_hardware (xid-79) on gpu-002, from node kernel log"


def logged_in(user: User) -> Client:
    client = Client()
    assert client.login(username=user.username, password=TEST_PASSWORD)
    return client


def drain_of(node: Node, status: str = RecommendationStatus.AWAITING_APPROVAL) -> Recommendation:
    return RecommendationFactory(
        workload=WorkloadFactory(cluster=node.cluster),
        node=node,
        action=RecommendationAction.DRAIN,
        excluded_nodes=[],
        reason=REASON,
        status=status,
    )


@pytest.fixture
def node() -> Node:
    cluster = ClusterFactory(name="lab")
    for n in range(1, 11):
        Node.objects.create(cluster=cluster, name=f"gpu-{n:03d}", scheduler_state="MIXED")
    return Node.objects.get(name="gpu-002")


def test_the_approvals_page_says_which_node_a_drain_takes_out_and_why(
    operator: User, node: Node
) -> None:
    drain = drain_of(node)
    page = logged_in(operator).get(reverse("console:approvals")).content.decode()
    card = page[page.index(f'id="recommendation-{drain.pk}"') :]
    assert "Drain node" in card and "gpu-002" in card
    assert "every drain waits for an operator" in card
    assert REASON in card and "Slurm will show" in card
    assert "Excluded nodes" not in card[: card.index("</li>")]


def test_an_approval_over_the_blast_radius_is_refused_with_the_reason(
    operator: User, node: Node
) -> None:
    Policy.objects.create(name="lab", cluster=node.cluster, blast_radius_percent=10)
    drain_of(Node.objects.get(name="gpu-001"), RecommendationStatus.READY)
    drain = drain_of(node)
    client = logged_in(operator)
    answer = client.post(
        reverse("console:approve", args=[drain.pk]),
        {"next": reverse("console:approvals")},
        follow=True,
    )
    assert "Not approved: draining gpu-002 would leave 2 of 10 nodes" in answer.content.decode()
    drain.refresh_from_db()
    assert drain.status == RecommendationStatus.AWAITING_APPROVAL


def test_an_operator_resumes_a_node_recovery_drained_and_a_viewer_cannot(
    operator: User, viewer: User, node: Node
) -> None:
    """
    GIVEN a node the scheduler shows drained with recovery's reason
    WHEN a viewer and then an operator press Resume on the Nodes page, twice
    THEN the viewer is refused; one resume, approved by the operator, goes to the controller
    """
    drain_of(node, RecommendationStatus.EXECUTED)
    node.scheduler_state, node.state_reason = "IDLE+DRAIN", REASON
    node.save()
    nodes_page = reverse("console:nodes")
    as_viewer, as_operator = logged_in(viewer), logged_in(operator)
    page = as_viewer.get(nodes_page).content.decode()
    assert "drained by recovery" in page and "Resume in scheduler" not in page
    page = as_operator.get(nodes_page).content.decode()
    assert "Resume in scheduler" in page

    url = reverse("console:resume_node", args=[node.pk])
    assert as_viewer.post(url).status_code == 403
    assert not Recommendation.objects.filter(action=RecommendationAction.RESUME).exists()

    answer = as_operator.post(url, {"next": nodes_page, "note": "reseated"}, follow=True)
    assert "Resume of gpu-002 sent to the cluster" in answer.content.decode()
    resume = Recommendation.objects.get(action=RecommendationAction.RESUME)
    assert (resume.status, resume.approved_by) == (RecommendationStatus.READY, "otto")
    page = as_operator.post(url, {"next": nodes_page}, follow=True).content.decode()
    assert "already under way" in page
    assert "Resume node: ready" in page  # the node's open action, instead of the button
    assert Recommendation.objects.filter(action=RecommendationAction.RESUME).count() == 1
    assert AuditEvent.objects.filter(kind=AuditKind.APPROVED, actor="otto").count() == 1


def test_a_node_an_administrator_drained_offers_no_resume(operator: User, node: Node) -> None:
    node.scheduler_state, node.state_reason = "DRAINED", "admin: swap PSU"
    node.times_implicated = 1  # listed on the page
    node.save()
    page = logged_in(operator).get(reverse("console:nodes")).content.decode()
    assert "gpu-002" in page and "Resume in scheduler" not in page


def test_the_nodes_page_lists_drains_by_themselves(operator: User, node: Node) -> None:
    drain_of(node)
    page = logged_in(operator).get(reverse("console:nodes") + "?show=drain").content.decode()
    assert "gpu-002" in page and "Drain node: awaiting approval" in page
    assert "gpu-001" not in page


def test_the_nodes_page_says_why_recovery_leaves_a_node_alone(operator: User, node: Node) -> None:
    """
    GIVEN a node an administrator set DOWN for an RMA, a node whose state could not be read,
          and a node recovery drained that an administrator then set DOWN
    WHEN an operator opens the Nodes page
    THEN each says why recovery neither drains nor resumes it, with the reason and who set it,
         and none offers a resume
    """
    Node.objects.filter(name="gpu-002").update(
        scheduler_state="DOWN",
        state_reason="RMA 4411 do not resume",
        reason_set_by="root",
        times_implicated=1,
    )
    Node.objects.filter(name="gpu-003").update(
        scheduler_state="", unreadable={"state": "state: unknown shape dict"}, times_implicated=1
    )
    Node.objects.filter(name="gpu-004").update(
        scheduler_state="DOWN+DRAIN",
        state_flags=["DRAIN"],
        state_reason=REASON,
        times_implicated=1,
    )
    page = logged_in(operator).get(reverse("console:nodes")).content.decode()
    down = page[page.index(">gpu-002<") : page.index("</tr>", page.index(">gpu-002<"))]
    assert "not recovery's" in down and "RMA 4411 do not resume" in down
    assert "set by root" in down
    assert "gpu-002 is out of service (DOWN, reason &#x27;RMA 4411 do not resume&#x27;" in down
    assert "State unknown (state: state: unknown shape dict)" in page
    assert "Not resumed by recovery: gpu-004 is DOWN+DRAIN" in page
    assert "Resume in scheduler" not in page


def test_the_approvals_page_says_when_a_drains_node_is_no_longer_recoverys(
    operator: User, node: Node
) -> None:
    drain = drain_of(node)
    Node.objects.filter(pk=node.pk).update(
        scheduler_state="DOWN", state_reason="RMA 4411 do not resume", reason_set_by="root"
    )
    page = logged_in(operator).get(reverse("console:approvals")).content.decode()
    card = page[page.index(f'id="recommendation-{drain.pk}"') :]
    card = card[: card.index("</li>")]
    assert "Not recovery's node" in card
    assert "recovery will not drain it: gpu-002 is out of service (DOWN" in card
    assert "(set by root)" in card
