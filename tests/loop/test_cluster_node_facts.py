"""The cluster's nodes a decision's facts hold: those some policy keeps out of a restart."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from recovery.choices import NodeHealth
from recovery.loop import decision_facts
from recovery.loop.decision_facts import cluster_node_facts
from recovery.models import Cluster, Node

pytestmark = pytest.mark.django_db


def test_each_node_kept_out_for_any_reason_is_held_once_in_name_order() -> None:
    """
    GIVEN a node excluded, one unhealthy and recently implicated, one suspect, one that is all
          three, one unhealthy long ago, and a healthy one (plus another cluster's excluded node)
    WHEN the facts are read
    THEN the first four are held once each, by name, and nothing else; in three queries
    """
    now = timezone.now()
    cluster = Cluster.objects.create(name="facts")
    other = Cluster.objects.create(name="facts-other")
    later, recently, long_ago = (
        now + timedelta(hours=1),
        now - timedelta(hours=1),
        now - timedelta(days=400),
    )
    Node.objects.create(cluster=cluster, name="n4-excluded", excluded_until=later)
    Node.objects.create(
        cluster=cluster,
        name="n2-unhealthy",
        health=NodeHealth.UNHEALTHY,
        last_implicated_at=recently,
    )
    Node.objects.create(cluster=cluster, name="n3-suspect", suspect_since=recently)
    Node.objects.create(
        cluster=cluster, name="n1-all", excluded_until=later, health=NodeHealth.UNHEALTHY,
        last_implicated_at=recently, suspect_since=recently,
    )  # fmt: skip
    Node.objects.create(
        cluster=cluster, name="n0-old", health=NodeHealth.UNHEALTHY, last_implicated_at=long_ago
    )
    Node.objects.create(cluster=cluster, name="n5-expired", excluded_until=recently)
    Node.objects.create(cluster=cluster, name="n6-healthy", health=NodeHealth.HEALTHY)
    Node.objects.create(cluster=other, name="n7-elsewhere", excluded_until=later)
    with CaptureQueriesContext(connection) as queries:
        facts = cluster_node_facts(cluster.pk, now)
    assert [row[0] for row in facts] == ["n1-all", "n2-unhealthy", "n3-suspect", "n4-excluded"]
    assert facts[0][2] == NodeHealth.UNHEALTHY and facts[0][1] is not None
    assert facts[3][1:] == [later.isoformat(), NodeHealth.UNKNOWN, None, None]
    assert len(queries) == 3


def test_past_the_limit_the_first_nodes_by_name_are_held(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decision_facts, "MAX_CLUSTER_NODES", 3)
    now = timezone.now()
    cluster = Cluster.objects.create(name="facts-limit")
    for name in ["e", "c", "a"]:
        Node.objects.create(cluster=cluster, name=name, excluded_until=now + timedelta(hours=1))
    for name in ["d", "b"]:
        Node.objects.create(cluster=cluster, name=name, suspect_since=now)
    assert [row[0] for row in cluster_node_facts(cluster.pk, now)] == ["a", "b", "c"]
