"""Which evidence leads to a drain, when it waits for a person, and the blast radius on drains.

The controller's side is in tests/controller/test_node_actions.py; real Slurm nodes are drained
and resumed in tests/slurm/test_drains.py.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from recovery.audit.cluster_controls import save_with_audit
from recovery.choices import (
    AuditKind,
    ClusterMode,
    EvidenceSource,
    NodeHealth,
    RecommendationAction,
    RecommendationStatus,
)
from recovery.detection.findings import Finding
from recovery.loop import recommendations
from recovery.loop.anomalies import record_anomalies
from recovery.loop.drains import request_resume
from recovery.loop.monitors import check_node
from recovery.models import Attempt, AuditEvent, Cluster, Node, Policy, Recommendation
from recovery.schedulers.base import DRAIN_REASON_PREFIX
from tests.factories import AttemptFactory, ClusterFactory, WorkloadFactory, xid_79

pytestmark = pytest.mark.django_db

NODES = [f"gpu-{n:03d}" for n in range(1, 11)]


@pytest.fixture
def cluster() -> Cluster:
    cluster = ClusterFactory(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True)
    Policy.objects.create(name="lab", cluster=cluster, blast_radius_percent=20)
    for name in NODES:
        Node.objects.create(cluster=cluster, name=name, scheduler_state="ALLOCATED")
    return cluster


def running(cluster: Cluster, nodes: list[str] | None = None) -> Attempt:
    workload = WorkloadFactory(cluster=cluster)
    attempt: Attempt = AttemptFactory(workload=workload, nodes=nodes or ["gpu-001", "gpu-002"])
    return attempt


def seen(attempt: Attempt, source: EvidenceSource, finding: Finding | None = None) -> None:
    record_anomalies(
        attempt.workload,
        attempt,
        [finding or xid_79("gpu-002")],
        timezone.now(),
        scope="kernel:gpu-002" if source == EvidenceSource.KERNEL_LOG else "",
        source=source,
    )


def drains() -> list[Recommendation]:
    return list(Recommendation.objects.filter(action=RecommendationAction.DRAIN).order_by("pk"))


@pytest.mark.parametrize(
    "source", [EvidenceSource.KERNEL_LOG, EvidenceSource.GPU_METRICS, EvidenceSource.SCHEDULER]
)
def test_a_site_fact_blaming_hardware_recommends_a_drain_that_waits_for_a_person(
    cluster: Cluster, source: EvidenceSource
) -> None:
    """
    GIVEN an acknowledged action-mode cluster that does not drain automatically
    WHEN a site fact shows Xid 79 on a node of a running job
    THEN a drain of that node is recommended, awaiting approval, with recovery's reason
    """
    seen(running(cluster), source)
    [drain] = drains()
    assert drain.node is not None and drain.node.name == "gpu-002"
    assert drain.status == RecommendationStatus.AWAITING_APPROVAL
    assert drain.reason.startswith(f"{DRAIN_REASON_PREFIX} hardware: gpu_hardware (xid-79)")
    event = AuditEvent.objects.get(kind=AuditKind.RECOMMENDED, payload__action="drain")
    assert event.payload["node"] == "gpu-002"
    assert event.payload["would_have_done"] is True
    # The drain is no decision about the job's attempt: that is decided on its own.
    assert drain.attempt is None


@pytest.mark.parametrize("source", [EvidenceSource.JOB_OUTPUT, EvidenceSource.PUSHED])
def test_what_a_job_printed_never_drains_a_node(cluster: Cluster, source: EvidenceSource) -> None:
    seen(running(cluster), source)
    assert drains() == []


def test_an_application_fault_on_a_site_source_drains_nothing(cluster: Cluster) -> None:
    xid_13 = Finding(
        kind="crash",
        category="cuda_error_app",
        attribution="application",
        severity="fatal",
        signature="xid-13",
        evidence="NVRM: Xid (PCI:0000:3b:00): 13, Graphics Exception",
        nodes=["gpu-002"],
        detail={"role": "cause", "xid": 13},
    )
    seen(running(cluster), EvidenceSource.KERNEL_LOG, xid_13)
    assert drains() == []


def test_a_cluster_that_drains_automatically_makes_the_drain_ready(cluster: Cluster) -> None:
    cluster.drain_automatically = True
    cluster.save()
    seen(running(cluster), EvidenceSource.KERNEL_LOG)
    assert [d.status for d in drains()] == [RecommendationStatus.READY]


def test_monitor_mode_waits_for_a_person_even_when_drains_are_automatic(cluster: Cluster) -> None:
    cluster.mode, cluster.drain_automatically = ClusterMode.MONITOR, True
    cluster.save()
    seen(running(cluster), EvidenceSource.KERNEL_LOG)
    assert [d.status for d in drains()] == [RecommendationStatus.AWAITING_APPROVAL]


def test_a_node_is_recommended_for_one_drain_at_a_time(cluster: Cluster) -> None:
    seen(running(cluster), EvidenceSource.KERNEL_LOG)
    seen(running(cluster), EvidenceSource.GPU_METRICS)  # another job, the same node
    assert len(drains()) == 1


def test_a_drained_node_is_not_recommended_for_a_drain(cluster: Cluster) -> None:
    Node.objects.filter(name="gpu-002").update(
        scheduler_state="MIXED+DRAIN", state_reason="admin: swap PSU"
    )
    seen(running(cluster), EvidenceSource.KERNEL_LOG)
    assert drains() == []


def test_a_rejected_drain_is_not_asked_again_within_the_exclusion_time(cluster: Cluster) -> None:
    seen(running(cluster), EvidenceSource.KERNEL_LOG)
    recommendations.reject(drains()[0].pk, operator="ops", note="known flaky exporter")
    seen(running(cluster), EvidenceSource.GPU_METRICS)
    assert [d.status for d in drains()] == [RecommendationStatus.REJECTED]

    Recommendation.objects.filter(action=RecommendationAction.DRAIN).update(
        updated_at=timezone.now() - timedelta(days=30)
    )
    seen(running(cluster), EvidenceSource.SCHEDULER)
    assert len(drains()) == 2


def test_drains_over_the_blast_radius_are_withheld_and_said_once(cluster: Cluster) -> None:
    """
    GIVEN a ten-node cluster whose policy allows 20 %, two nodes drained by recovery already
    WHEN site facts blame a third node, twice
    THEN no drain is recommended, and one drain_withheld event says why
    """
    for name in ("gpu-005", "gpu-006"):
        Node.objects.filter(name=name).update(
            scheduler_state="IDLE+DRAIN", state_reason=f"{DRAIN_REASON_PREFIX} xid 79"
        )
    seen(running(cluster), EvidenceSource.KERNEL_LOG)
    seen(running(cluster), EvidenceSource.GPU_METRICS)
    assert drains() == []
    [withheld] = AuditEvent.objects.filter(kind=AuditKind.DRAIN_WITHHELD)
    assert withheld.payload["node"] == "gpu-002"
    assert "3 of 10 nodes drained by recovery" in withheld.payload["reason"]


def test_an_approval_that_would_pass_the_blast_radius_is_refused(cluster: Cluster) -> None:
    seen(running(cluster), EvidenceSource.KERNEL_LOG)
    seen(running(cluster, ["gpu-003"]), EvidenceSource.KERNEL_LOG, xid_79("gpu-003"))
    seen(running(cluster, ["gpu-004"]), EvidenceSource.KERNEL_LOG, xid_79("gpu-004"))
    first, second, third = drains()  # each alone is within 20 %: all three recommended
    assert recommendations.approve(first.pk, operator="ops").changed
    assert recommendations.approve(second.pk, operator="ops").changed
    refused = recommendations.approve(third.pk, operator="ops")
    assert not refused.changed
    assert refused.message.startswith("Not approved: draining gpu-004 would leave 3 of 10")
    third.refresh_from_db()
    assert third.status == RecommendationStatus.AWAITING_APPROVAL


def test_recoverys_own_drain_reason_is_not_new_evidence(cluster: Cluster) -> None:
    attempt = running(cluster)
    node = Node.objects.get(name="gpu-002")
    node.scheduler_state, node.state_reason = "MIXED+DRAIN", f"{DRAIN_REASON_PREFIX} xid 79"
    node.save()
    assert check_node(cluster, node, timezone.now()) == []
    assert not attempt.anomalies.exists()


def test_an_operator_resumes_only_recoverys_own_drain(cluster: Cluster) -> None:
    seen(running(cluster), EvidenceSource.KERNEL_LOG)
    node = Node.objects.get(name="gpu-002")

    assert "not drained" in request_resume(node.pk, operator="ops").message
    node.scheduler_state, node.state_reason = "IDLE+DRAIN", "admin: swap PSU"
    node.save()
    assert (
        "drained by someone else (admin: swap PSU)"
        in request_resume(node.pk, operator="ops").message
    )

    node.state_reason = drains()[0].reason
    node.save()
    asked = request_resume(node.pk, operator="ops", note="reseated")
    assert asked.changed and asked.recommendation is not None
    resume = asked.recommendation
    assert (resume.action, resume.status) == (
        RecommendationAction.RESUME,
        RecommendationStatus.READY,
    )
    assert resume.approved_by == "ops" and resume.node == node
    event = AuditEvent.objects.get(kind=AuditKind.APPROVED, payload__action="resume")
    assert (event.actor, event.payload["node"], event.payload["note"]) == (
        "ops",
        "gpu-002",
        "reseated",
    )
    again = request_resume(node.pk, operator="ops")
    assert not again.changed and again.recommendation == resume
    assert node.health != NodeHealth.HEALTHY  # resuming in Slurm is not returning it to recovery


def test_who_lets_a_cluster_drain_on_its_own_is_in_the_trail(cluster: Cluster) -> None:
    cluster.drain_automatically = True
    save_with_audit(cluster, "admin", cluster.save)
    save_with_audit(cluster, "admin", cluster.save)
    [event] = AuditEvent.objects.filter(kind=AuditKind.AUTOMATIC_DRAIN_CHANGED)
    assert (event.actor, event.payload) == ("admin", {"from": False, "to": True})


# --- only nodes recovery may own --------------------------------------------------------------


def refused_events() -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(kind=AuditKind.DRAIN_REFUSED).order_by("pk"))


@pytest.mark.parametrize(
    ("state", "flags", "reason"),
    [
        ("DOWN", [], "RMA 4411 do not resume"),
        ("DOWN", ["NOT_RESPONDING"], "Not responding"),
        ("IDLE", ["DRAIN"], "admin: swap PSU"),
        ("MIXED", ["MAINTENANCE"], ""),
        ("IDLE", ["REBOOT_REQUESTED"], ""),
        ("IDLE", ["POWERED_DOWN"], ""),
        ("IDLE", ["FAIL"], "bad DIMM"),
        ("ALLOCATED", ["A_FLAG_OF_A_LATER_SLURM"], ""),
    ],
)
def test_a_node_out_of_service_gets_no_drain(
    cluster: Cluster, state: str, flags: list[str], reason: str
) -> None:
    """
    GIVEN a node an administrator or Slurm took out of service
    WHEN a site fact blames its hardware, twice
    THEN no drain is recommended, and one drain_refused event keeps the node as read
    """
    Node.objects.filter(name="gpu-002").update(
        scheduler_state="+".join([state, *flags]),
        state_flags=flags,
        state_reason=reason,
        reason_set_by="root" if reason else "",
    )
    seen(running(cluster), EvidenceSource.KERNEL_LOG)
    seen(running(cluster), EvidenceSource.GPU_METRICS)
    assert drains() == []
    [refused] = refused_events()
    assert refused.payload["node"] == "gpu-002"
    assert refused.payload["node_state"]["state"] == state
    assert refused.payload["node_state"]["flags"] == flags
    assert refused.payload["node_state"]["reason"] == reason
    if reason:
        assert refused.payload["node_state"]["reason_set_by"] == "root"


@pytest.mark.parametrize(
    ("scheduler_state", "unreadable"),
    [
        ("", {"state": "state: null"}),
        ("", {}),  # never read
        ("ALLOCATED", {"reason": "reason: absent"}),
    ],
)
def test_a_node_whose_state_is_unknown_gets_no_drain(
    cluster: Cluster, scheduler_state: str, unreadable: dict[str, str]
) -> None:
    Node.objects.filter(name="gpu-002").update(
        scheduler_state=scheduler_state, unreadable=unreadable
    )
    seen(running(cluster), EvidenceSource.KERNEL_LOG)
    assert drains() == []
    [refused] = refused_events()
    assert refused.payload["reason"].startswith("the state of gpu-002 is unknown")


def test_a_reason_slurm_kept_on_a_node_back_in_service_does_not_stop_a_drain(
    cluster: Cluster,
) -> None:
    """Slurm 24.11 keeps the last reason on a node after it is resumed, and nothing clears it:
    the node is in service, and its old reason keeps nothing out."""
    Node.objects.filter(name="gpu-002").update(
        scheduler_state="ALLOCATED", state_reason="admin: kernel upgrade", reason_set_by="root"
    )
    seen(running(cluster), EvidenceSource.KERNEL_LOG)
    assert len(drains()) == 1 and refused_events() == []


def test_a_node_in_service_with_slurms_harmless_flags_gets_a_drain(cluster: Cluster) -> None:
    Node.objects.filter(name="gpu-002").update(
        scheduler_state="MIXED+COMPLETING+RESERVED", state_flags=["COMPLETING", "RESERVED"]
    )
    seen(running(cluster), EvidenceSource.KERNEL_LOG)
    assert len(drains()) == 1 and refused_events() == []


def test_a_drain_is_not_approved_once_an_administrator_took_the_node_out(
    cluster: Cluster,
) -> None:
    seen(running(cluster), EvidenceSource.KERNEL_LOG)
    [drain] = drains()
    Node.objects.filter(name="gpu-002").update(
        scheduler_state="DOWN", state_reason="RMA 4411 do not resume", reason_set_by="root"
    )
    decision = recommendations.approve(drain.pk, operator="ops")
    assert not decision.changed
    assert decision.message.startswith("Not approved: gpu-002 is out of service (DOWN")
    drain.refresh_from_db()
    assert drain.status == RecommendationStatus.AWAITING_APPROVAL


@pytest.mark.parametrize(
    ("scheduler_state", "state_flags", "reason", "refused"),
    [
        ("DOWN+DRAIN", ["DRAIN"], "RMA 4411 do not resume", "drained by someone else"),
        ("DOWN+DRAIN", ["DRAIN"], None, "more than recovery's drain keeps it out"),
        ("IDLE+DRAIN", ["DRAIN", "MAINTENANCE"], None, "more than recovery's drain keeps it out"),
        ("IDLE+DRAIN", ["DRAIN", "NOT_RESPONDING"], None, "more than recovery's drain"),
        ("", [], None, "the state of gpu-002 is unknown"),
    ],
)
def test_a_resume_is_refused_where_more_than_recoverys_drain_keeps_the_node_out(
    cluster: Cluster,
    scheduler_state: str,
    state_flags: list[str],
    reason: str | None,
    refused: str,
) -> None:
    seen(running(cluster), EvidenceSource.KERNEL_LOG)
    [drain] = drains()
    Node.objects.filter(name="gpu-002").update(
        scheduler_state=scheduler_state,
        state_flags=state_flags,
        state_reason=reason if reason is not None else drain.reason,
        unreadable={} if scheduler_state else {"state": "state: null"},
    )
    asked = request_resume(Node.objects.get(name="gpu-002").pk, operator="ops")
    assert not asked.changed and asked.recommendation is None
    assert refused in asked.message
    assert not Recommendation.objects.filter(action=RecommendationAction.RESUME).exists()
