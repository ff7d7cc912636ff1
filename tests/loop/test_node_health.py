"""A repaired node is returned to service by an operator; restarts may use it again."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from recovery.choices import AuditKind, NodeHealth
from recovery.loop.node_health import return_to_service
from recovery.loop.policy import kept_out_of_every_job
from recovery.models import AuditEvent, Node, Policy
from tests.conftest import TEST_PASSWORD
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db


def unhealthy_node() -> Node:
    return Node.objects.create(
        cluster=ClusterFactory(),
        name="gpu-003",
        health=NodeHealth.UNHEALTHY,
        last_implicated_at=timezone.now(),
        excluded_until=timezone.now() + timedelta(hours=5),
    )


def test_a_returned_node_is_no_longer_kept_out_and_the_trail_says_who() -> None:
    node = unhealthy_node()
    assert kept_out_of_every_job(node.cluster_id, Policy()) == {"gpu-003": "unhealthy"}

    first = return_to_service(node.pk, operator="operator:olivia", note="GPU reseated")
    again = return_to_service(node.pk, operator="operator:omar")

    assert (first.changed, again.changed) == (True, False)
    assert kept_out_of_every_job(node.cluster_id, Policy()) == {}
    (event,) = AuditEvent.objects.filter(kind=AuditKind.NODE_RETURNED)
    assert event.actor == "operator:olivia"
    assert event.payload["before"]["health"] == NodeHealth.UNHEALTHY
    assert event.payload["note"] == "GPU reseated"


def test_only_an_operator_returns_a_node_from_the_nodes_page(operator: User, viewer: User) -> None:
    node = unhealthy_node()
    url = reverse("console:return_node", args=[node.pk])
    as_viewer, as_operator = Client(), Client()
    assert as_viewer.login(username=viewer.username, password=TEST_PASSWORD)
    assert as_operator.login(username=operator.username, password=TEST_PASSWORD)

    assert "Return to service" not in as_viewer.get(reverse("console:nodes")).content.decode()
    assert as_viewer.post(url).status_code == 403
    assert "Return to service" in as_operator.get(reverse("console:nodes")).content.decode()
    assert as_operator.post(url).status_code == 302
    node.refresh_from_db()
    assert node.health == NodeHealth.HEALTHY and node.excluded_until is None
