"""A job names its environment in its comment; that never sets what happens to nodes and to
other users' jobs.

The site has a cluster policy (10 % blast radius, 24 h exclusions, three workloads make a node
suspect) and a lenient "scratch" policy meant for its scratch partition (100 %, 2,160 h, two).
A tenant's job on the production partition writes ``"environment": "scratch"``: its drains,
the nodes it gets excluded on the cluster, its restarts' share of the cluster and the suspects
it adds to all follow the cluster's policy. Where the operator bound "scratch" to the
partition, they follow the scratch policy: the control. The job's own recovery (its retry
budget) follows the environment it named either way.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from recovery.choices import (
    AuditKind,
    ClusterMode,
    EvidenceSource,
    EvidenceTrust,
    RecommendationAction,
    RecommendationStatus,
)
from recovery.detection.findings import Finding
from recovery.loop.anomalies import record_anomalies
from recovery.loop.policy import recommend
from recovery.loop.recommendations import ActionReport, claim, report
from recovery.models import (
    Anomaly,
    Attempt,
    AuditEvent,
    Cluster,
    EnvironmentBinding,
    Node,
    Policy,
    Recommendation,
    Workload,
)
from recovery.schedulers.base import DRAIN_REASON_PREFIX
from tests.factories import AnomalyFactory, AttemptFactory, ClusterFactory, WorkloadFactory

pytestmark = pytest.mark.django_db

NODES = [f"gpu-{n:03d}" for n in range(1, 11)]
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2231, name=python, GPU has fallen off the bus."


@pytest.fixture
def cluster() -> Cluster:
    cluster = ClusterFactory(
        name="shared", mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True
    )
    for name in NODES:
        Node.objects.create(cluster=cluster, name=name, scheduler_state="ALLOCATED")
    Policy.objects.create(
        name="shared site",
        cluster=cluster,
        blast_radius_percent=10,
        exclusion_hours=24,
        suspect_node_workloads=3,
        max_attempts=2,
    )
    Policy.objects.create(
        name="scratch",
        cluster=cluster,
        environment="scratch",
        blast_radius_percent=100,
        exclusion_hours=24 * 90,
        suspect_node_workloads=2,
        max_attempts=50,
        max_attempts_without_checkpoint=50,
    )
    return cluster


def tenant_job(cluster: Cluster, nodes: list[str], job_id: str = "") -> Attempt:
    """A job of the tenant's on the production partition, naming the scratch environment."""
    workload = WorkloadFactory(
        cluster=cluster,
        user="mallory",
        partition="prod",
        account="physics",
        environment="scratch",
        **({"job_id": job_id} if job_id else {}),
    )
    attempt: Attempt = AttemptFactory(workload=workload, nodes=nodes)
    return attempt


def bind_scratch_to_prod(cluster: Cluster) -> None:
    EnvironmentBinding.objects.create(cluster=cluster, environment="scratch", partition="prod")


def xid_79(node: str) -> Finding:
    return Finding(
        kind="crash",
        category="gpu_hardware",
        attribution="hardware",
        severity="fatal",
        signature="xid-79",
        evidence=XID,
        nodes=[node],
        detail={"role": "cause", "xid": 79},
    )


def kernel_says_xid(attempt: Attempt, node: str) -> None:
    """A site fact: the node's own kernel log."""
    record_anomalies(
        attempt.workload,
        attempt,
        [xid_79(node)],
        timezone.now(),
        scope=f"kernel:{node}",
        source=EvidenceSource.KERNEL_LOG,
    )


def drains() -> list[Recommendation]:
    return list(Recommendation.objects.filter(action=RecommendationAction.DRAIN))


def two_nodes_drained_by_recovery() -> None:
    Node.objects.filter(name__in=["gpu-005", "gpu-006"]).update(
        scheduler_state="IDLE+DRAIN", state_reason=f"{DRAIN_REASON_PREFIX} xid 79"
    )


# ---------- drains ----------


def test_a_job_naming_a_lenient_environment_drains_no_more_than_the_cluster_allows(
    cluster: Cluster,
) -> None:
    """
    GIVEN two of ten nodes drained by recovery, and a cluster policy allowing 10 %
    WHEN the kernel log blames a third node under a job that names "scratch" (100 %)
    THEN no drain is asked for: the cluster's blast radius holds, and the trail says so
    """
    two_nodes_drained_by_recovery()
    kernel_says_xid(tenant_job(cluster, ["gpu-002"]), "gpu-002")
    assert drains() == []
    [withheld] = AuditEvent.objects.filter(kind=AuditKind.DRAIN_WITHHELD)
    assert "over the policy's blast radius of 10 %" in withheld.payload["reason"]


def test_the_operator_binding_scratch_to_the_partition_lets_its_blast_radius_apply(
    cluster: Cluster,
) -> None:
    bind_scratch_to_prod(cluster)
    two_nodes_drained_by_recovery()
    kernel_says_xid(tenant_job(cluster, ["gpu-002"]), "gpu-002")
    [drain] = drains()
    assert drain.node is not None and drain.node.name == "gpu-002"
    event = AuditEvent.objects.get(kind=AuditKind.RECOMMENDED, payload__action="drain")
    assert event.payload["policy"] == "scratch"


# ---------- nodes excluded on the cluster ----------


def executed_restart_excluding(attempt: Attempt, node: str) -> None:
    """The job's restart without ``node``, which a site fact implicated, carried out."""
    workload = attempt.workload
    Anomaly.objects.create(
        workload=workload,
        attempt=attempt,
        kind="crash",
        category="gpu_hardware",
        attribution="hardware",
        evidence_line=XID,
        implicated_nodes=[node],
        fingerprint="fp-site",
        evidence_at=timezone.now() - timedelta(seconds=5),
        evidence_source=EvidenceSource.SCHEDULER,
        evidence_trust=EvidenceTrust.SITE,
    )
    recommendation = Recommendation.objects.create(
        workload=workload,
        attempt=attempt,
        action=RecommendationAction.RESTART_EXCLUDING,
        excluded_nodes=[node],
        status=RecommendationStatus.READY,
        idempotency_key=f"test:{workload.pk}",
    )
    claim(recommendation.pk, controller="controller:c1", instance="i-1", lease_seconds=120)
    report(
        recommendation.pk,
        controller="controller:c1",
        instance="i-1",
        result=ActionReport(
            outcome=RecommendationStatus.EXECUTED,
            state_before={"job_state": "FAILED"},
            commands=[{"argv": ["scontrol", "requeuehold", workload.job_id], "returncode": 0}],
            converged=True,
        ),
    )


def excluded_for_hours(node: str) -> float:
    until = Node.objects.get(name=node).excluded_until
    assert until is not None
    return (until - timezone.now()).total_seconds() / 3600


def test_a_job_naming_a_lenient_environment_excludes_a_node_only_for_the_clusters_hours(
    cluster: Cluster,
) -> None:
    """
    GIVEN a cluster policy excluding nodes for 24 h, and "scratch" excluding them for 2,160 h
    WHEN a restart of a job naming "scratch" leaves out a node a site fact implicated
    THEN the node is kept from every job for 24 h, not 90 days
    """
    executed_restart_excluding(tenant_job(cluster, ["gpu-003"]), "gpu-003")
    assert Recommendation.objects.get().status == RecommendationStatus.EXECUTED
    assert 23.9 < excluded_for_hours("gpu-003") <= 24


def test_the_operator_binding_scratch_lets_its_exclusion_hours_apply(cluster: Cluster) -> None:
    bind_scratch_to_prod(cluster)
    executed_restart_excluding(tenant_job(cluster, ["gpu-003"]), "gpu-003")
    assert excluded_for_hours("gpu-003") > 24 * 89


# ---------- restarts counted against the cluster's blast radius ----------


def test_a_job_naming_a_lenient_environment_asks_a_person_past_the_clusters_blast_radius(
    cluster: Cluster,
) -> None:
    """
    GIVEN a cluster acting on its own with a 10 % blast radius
    WHEN a job naming "scratch" (100 %) crashes on a fault implicating 3 of 10 nodes
    THEN its restart waits for a person; the trail names both policies and why
    """
    attempt = tenant_job(cluster, ["gpu-001", "gpu-002", "gpu-003"])
    crash = AnomalyFactory(
        workload=attempt.workload,
        attempt=attempt,
        implicated_nodes=["gpu-001", "gpu-002", "gpu-003"],
    )
    recommendation = recommend(crash)
    assert recommendation is not None
    assert recommendation.action == RecommendationAction.RESTART_EXCLUDING
    assert recommendation.status == RecommendationStatus.AWAITING_APPROVAL
    event = AuditEvent.objects.get(kind=AuditKind.RECOMMENDED)
    assert (event.payload["policy"], event.payload["site_policy"]) == ("scratch", "shared site")
    assert "'scratch' is not bound to partition 'prod'" in event.payload["environment_refused"]


def test_bound_by_the_operator_the_same_restart_is_ready(cluster: Cluster) -> None:
    bind_scratch_to_prod(cluster)
    attempt = tenant_job(cluster, ["gpu-001", "gpu-002", "gpu-003"])
    crash = AnomalyFactory(
        workload=attempt.workload,
        attempt=attempt,
        implicated_nodes=["gpu-001", "gpu-002", "gpu-003"],
    )
    recommendation = recommend(crash)
    assert recommendation is not None
    assert recommendation.status == RecommendationStatus.READY


# ---------- suspects ----------


def test_a_job_naming_a_lenient_environment_makes_no_node_suspect_on_fewer_workloads(
    cluster: Cluster,
) -> None:
    """
    GIVEN a cluster policy where three workloads make a node suspect, "scratch" says two
    WHEN the node's kernel log blames it under two of the tenant's jobs naming "scratch"
    THEN the node is not suspect; a third workload makes it so
    """
    for job_id in ("7001", "7002"):
        kernel_says_xid(tenant_job(cluster, ["gpu-004"], job_id), "gpu-004")
    assert Node.objects.get(name="gpu-004").suspect_since is None
    assert not AuditEvent.objects.filter(kind=AuditKind.NODE_SUSPECT).exists()

    kernel_says_xid(tenant_job(cluster, ["gpu-004"], "7003"), "gpu-004")
    assert Node.objects.get(name="gpu-004").suspect_since is not None


def test_the_operator_binding_scratch_lets_two_workloads_make_a_node_suspect(
    cluster: Cluster,
) -> None:
    bind_scratch_to_prod(cluster)
    for job_id in ("7001", "7002"):
        kernel_says_xid(tenant_job(cluster, ["gpu-004"], job_id), "gpu-004")
    assert Node.objects.get(name="gpu-004").suspect_since is not None


# ---------- the job's own recovery ----------


def test_the_environment_still_sets_the_jobs_own_retry_budget(cluster: Cluster) -> None:
    """The cluster's policy would stop the job after two attempts (or three without a
    checkpoint); "scratch" allows fifty."""
    attempt = tenant_job(cluster, ["gpu-001"])
    for number in (2, 3):
        Attempt.objects.create(workload=attempt.workload, number=number, nodes=["gpu-001"])
    Workload.objects.filter(pk=attempt.workload.pk).update(current_attempt=3)
    attempt.workload.refresh_from_db()
    crash = AnomalyFactory(
        workload=attempt.workload,
        category="nccl_timeout",
        attribution="unknown",
        implicated_nodes=[],
    )
    recommendation = recommend(crash)
    assert recommendation is not None
    assert recommendation.action == RecommendationAction.RESTART


# ---------- what the job's owner and the operators see ----------


def test_the_workload_page_and_the_api_say_why_the_environment_was_refused(
    cluster: Cluster, viewer: User
) -> None:
    workload = tenant_job(cluster, ["gpu-001"]).workload
    client = APIClient()
    client.force_login(viewer)
    page = client.get(reverse("console:workload", args=[workload.pk])).content.decode()
    assert (
        "Environment &#x27;scratch&#x27; is not bound to partition &#x27;prod&#x27; or account "
        "&#x27;physics&#x27; on this cluster: the cluster&#x27;s policy applies to nodes and "
        "other jobs."
    ) in page
    assert "shared site" in page  # the policy for nodes and other jobs
    shown = client.get(f"/api/v1/workloads/{workload.pk}/").json()
    assert (shown["policy"], shown["site_policy"]) == ("scratch", "shared site")
    assert shown["environment_refused"].startswith("environment 'scratch' is not bound")

    bind_scratch_to_prod(cluster)
    page = client.get(reverse("console:workload", args=[workload.pk])).content.decode()
    assert "is not bound" not in page
    assert "bound by the operator to partition prod" in page
    [shown] = client.get("/api/v1/workloads/").json()["results"]
    assert (shown["site_policy"], shown["environment_refused"]) == ("scratch", "")
