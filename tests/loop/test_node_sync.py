"""The poll keeps what tells whose node it is: its state read whole or unknown, every flag, and
its reason with who set it when."""

from __future__ import annotations

from datetime import datetime

import pytest

from recovery.loop.poll import poll_cluster
from recovery.models import Node
from recovery.schedulers.base import NodeInfo
from recovery.schedulers.compat import UTC
from tests.factories import ClusterFactory
from tests.fakes import Scripted

pytestmark = pytest.mark.django_db

RMA_AT = datetime(2026, 12, 3, 9, 30, tzinfo=UTC)
RMA = NodeInfo(
    "node003",
    "DOWN",
    ["DRAIN", "NOT_RESPONDING"],
    "RMA 4411 do not resume",
    reason_set_by="root",
    reason_set_at=RMA_AT,
)
UNREADABLE = NodeInfo("node004", None, ["FROBNICATED"], "", unreadable={"state": "state: odd"})


def test_a_node_is_kept_with_every_flag_and_whose_reason_it_is() -> None:
    cluster = ClusterFactory()
    poll_cluster(cluster, Scripted([], [RMA]))
    node = Node.objects.get(name="node003")
    assert node.scheduler_state == "DOWN+DRAIN+NOT_RESPONDING"
    assert node.state_flags == ["DRAIN", "NOT_RESPONDING"]
    assert (node.state_reason, node.reason_set_by, node.reason_set_at) == (
        "RMA 4411 do not resume",
        "root",
        RMA_AT,
    )
    assert node.unreadable == {} and node.state_unknown == ""
    assert node.as_read() == RMA
    assert node.drain_refusal.startswith("node003 is out of service (DOWN+DRAIN+NOT_RESPONDING")
    assert "was drained by someone else" in node.resume_refusal


def test_an_unreadable_state_is_kept_as_unknown_never_as_a_state() -> None:
    cluster = ClusterFactory()
    scheduler = Scripted([], [NodeInfo("node004", "IDLE")])
    poll_cluster(cluster, scheduler)
    assert Node.objects.get(name="node004").drain_refusal == ""
    scheduler.nodes = [UNREADABLE]
    poll_cluster(cluster, scheduler)
    node = Node.objects.get(name="node004")
    assert node.scheduler_state == ""  # not the IDLE of the last poll, nor the words read now
    assert node.state_flags == ["FROBNICATED"]
    assert node.unreadable == {"state": "state: odd"}
    assert node.state_unknown == "state: state: odd"
    assert node.drain_refusal == "the state of node004 is unknown (state: state: odd)"
    assert node.resume_refusal.startswith("the state of node004 is unknown")


def test_an_unknown_reason_is_kept_as_unknown() -> None:
    cluster = ClusterFactory()
    poll_cluster(cluster, Scripted([], [NodeInfo("node001", "IDLE", reason=None)]))
    node = Node.objects.get(name="node001")
    assert node.unreadable == {"reason": "not reported by the scheduler"}
    assert node.as_read().reason is None
    assert node.drain_refusal.startswith("the state of node001 is unknown (reason: ")


def test_polling_the_same_nodes_again_writes_nothing() -> None:
    cluster = ClusterFactory()
    scheduler = Scripted([], [RMA, UNREADABLE, NodeInfo("node001", "MIXED")])
    poll_cluster(cluster, scheduler)
    before = dict(Node.objects.values_list("name", "updated_at"))
    poll_cluster(cluster, scheduler)
    assert dict(Node.objects.values_list("name", "updated_at")) == before


def test_a_changed_reason_is_written() -> None:
    cluster = ClusterFactory()
    scheduler = Scripted([], [RMA])
    poll_cluster(cluster, scheduler)
    scheduler.nodes = [NodeInfo("node003", "DOWN", ["DRAIN"], "RMA 4412", reason_set_by="ops")]
    poll_cluster(cluster, scheduler)
    node = Node.objects.get(name="node003")
    assert (node.state_reason, node.reason_set_by, node.reason_set_at) == ("RMA 4412", "ops", None)
    assert node.state_flags == ["DRAIN"]
