"""What a tenant's jobs print or push acts on those jobs only: it never blames a node for
everyone (suspect, unhealthy, excluded on the node list) and never touches another user's job.

The tenant holds a job token for its own user's jobs and pushes the lines a broken GPU would
print. The same lines from a node's kernel log (a site fact) do flag the node: the control.
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
    Confirmation,
    Connection,
    EvidenceSource,
    EvidenceTrust,
    NodeHealth,
    RecommendationStatus,
)
from recovery.detection.findings import Finding
from recovery.loop.anomalies import record_anomalies
from recovery.loop.confirmation import ReadContext
from recovery.loop.recommendations import ActionReport, claim, report
from recovery.models import (
    Anomaly,
    AuditEvent,
    Cluster,
    IngestToken,
    IngestTokenKind,
    Node,
    Policy,
    Recommendation,
    Workload,
)
from tests.factories import AttemptFactory, ClusterFactory, RecommendationFactory, WorkloadFactory

pytestmark = pytest.mark.django_db

LOGS = reverse("api:ingest-logs")
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2231, name=python, GPU has fallen off the bus."
NODE = "gpu-7"
# The launcher's report that the process ended: it confirms the crash the job printed.
TASK_EXITED = f"srun: error: {NODE}: task 0: Exited with exit code 1"


@pytest.fixture
def cluster() -> Cluster:
    cluster = ClusterFactory(name="shared", connection=Connection.SIMULATED)
    Node.objects.create(cluster=cluster, name=NODE)
    Policy.objects.create(name="suspects", cluster=cluster, suspect_node_workloads=2)
    return cluster


def tenant_jobs(cluster: Cluster, count: int) -> list[Workload]:
    jobs = []
    for index in range(count):
        workload = WorkloadFactory(cluster=cluster, job_id=str(7000 + index), user="mallory")
        AttemptFactory(workload=workload, number=1, nodes=[NODE])
        jobs.append(workload)
    return jobs


def tenant_client(cluster: Cluster) -> APIClient:
    _, key = IngestToken.issue(
        cluster, IngestTokenKind.JOB, name="user-mallory", issued_by="olga", user="mallory"
    )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def node_state(name: str = NODE) -> tuple[object, object, object]:
    node = Node.objects.get(name=name)
    return node.health, node.suspect_since, node.excluded_until


def test_xid_lines_pushed_by_one_users_jobs_never_make_a_node_suspect(cluster: Cluster) -> None:
    jobs = tenant_jobs(cluster, 4)
    client = tenant_client(cluster)
    before = node_state()
    for workload in jobs:
        body = {"job_id": workload.job_id, "node": NODE, "rank": 0, "lines": [XID, TASK_EXITED]}
        assert client.post(LOGS, body, format="json").status_code == 200
    # Each job's own anomaly is recorded, implicating the node for that job, as user evidence.
    anomalies = Anomaly.objects.filter(workload__in=jobs, category="gpu_hardware")
    assert anomalies.count() == 4
    assert {a.confirmation for a in anomalies} == {Confirmation.CONFIRMED}
    assert {(a.evidence_source, a.evidence_trust) for a in anomalies} == {
        (EvidenceSource.PUSHED, EvidenceTrust.USER)
    }
    assert all(a.implicated_nodes == [NODE] for a in anomalies)
    assert node_state() == before
    assert not AuditEvent.objects.filter(kind=AuditKind.NODE_SUSPECT).exists()


def _task_exited() -> Finding:
    return Finding(
        kind="crash",
        category="scheduler_event",
        attribution="unknown",
        severity="error",
        signature="srun-task-exited",
        evidence=TASK_EXITED,
        detail={"role": "wrapper", "reports_exit": True},
    )


def _xid_finding() -> Finding:
    return Finding(
        kind="crash",
        category="gpu_hardware",
        attribution="hardware",
        severity="fatal",
        signature="xid-79",
        evidence=XID,
        nodes=[NODE],
        detail={"role": "cause", "xid": 79},
    )


@pytest.mark.parametrize(
    ("source", "scope", "flagged"),
    [
        (EvidenceSource.JOB_OUTPUT, "", False),
        (EvidenceSource.LOG_STORE, "", False),
        (EvidenceSource.KERNEL_LOG, f"kernel:{NODE}", True),
    ],
)
def test_only_site_facts_count_towards_a_suspect_node(
    cluster: Cluster, source: EvidenceSource, scope: str, flagged: bool
) -> None:
    now = timezone.now()
    for workload in tenant_jobs(cluster, 3):
        record_anomalies(
            workload,
            workload.attempts.get(),
            [_xid_finding()],
            now,
            scope=scope,
            source=source,
            read=ReadContext(exits=[_task_exited()]),
        )
    assert (Node.objects.get(name=NODE).suspect_since is not None) is flagged
    assert AuditEvent.objects.filter(kind=AuditKind.NODE_SUSPECT).count() == int(flagged)


def test_a_pushed_node_failure_touches_only_the_pushing_job(cluster: Cluster) -> None:
    """The tenant's job runs beside a victim's job on gpu-7 and pushes a node failure naming it:
    the tenant's job has its anomaly; the victim's job, and the node, are untouched."""
    (own,) = tenant_jobs(cluster, 1)
    victim = WorkloadFactory(cluster=cluster, job_id="7100", user="alice")
    AttemptFactory(workload=victim, number=1, nodes=[NODE])
    line = (
        f"slurmstepd: error: *** JOB {victim.job_id} ON {NODE} CANCELLED AT "
        "2026-12-01T10:00:00 DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***"
    )
    before = node_state()
    response = tenant_client(cluster).post(
        LOGS, {"job_id": own.job_id, "node": NODE, "lines": [line, XID]}, format="json"
    )
    assert response.status_code == 200
    assert Anomaly.objects.filter(workload=own).exists()
    assert not Anomaly.objects.filter(workload=victim).exists()
    assert not Recommendation.objects.filter(workload=victim).exists()
    assert node_state() == before


def _executed_restart(workload: Workload, trust: EvidenceTrust) -> None:
    source = EvidenceSource.SCHEDULER if trust == EvidenceTrust.SITE else EvidenceSource.PUSHED
    Anomaly.objects.create(
        workload=workload,
        kind="crash",
        category="gpu_hardware",
        attribution="hardware",
        evidence_line=XID,
        implicated_nodes=[NODE],
        fingerprint=f"fp-{trust}",
        evidence_at=timezone.now() - timedelta(seconds=5),
        evidence_source=source,
        evidence_trust=trust,
    )
    recommendation = RecommendationFactory(
        workload=workload, status=RecommendationStatus.READY, excluded_nodes=[NODE]
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


@pytest.mark.parametrize(
    ("trust", "shown_excluded"), [(EvidenceTrust.USER, False), (EvidenceTrust.SITE, True)]
)
def test_a_node_is_shown_excluded_cluster_wide_only_on_a_site_fact(
    cluster: Cluster, trust: EvidenceTrust, shown_excluded: bool
) -> None:
    (workload,) = tenant_jobs(cluster, 1)
    _executed_restart(workload, trust)
    assert Recommendation.objects.get().status == RecommendationStatus.EXECUTED
    assert (Node.objects.get(name=NODE).excluded_until is not None) is shown_excluded


def test_the_console_and_the_api_say_where_evidence_came_from(
    cluster: Cluster, operator: User
) -> None:
    (workload,) = tenant_jobs(cluster, 1)
    tenant_client(cluster).post(
        LOGS, {"job_id": workload.job_id, "node": NODE, "lines": [XID]}, format="json"
    )
    browser = APIClient()
    browser.force_login(operator)
    page = browser.get(reverse("console:workload", args=[workload.pk]))
    assert page.status_code == 200
    assert "pushed by the job" in page.content.decode()
    assert "user-controlled" in page.content.decode()
    listed = browser.get("/api/v1/anomalies/", {"workload": workload.pk}).json()["results"]
    assert [(a["evidence_source"], a["evidence_trust"]) for a in listed] == [("pushed", "user")]
    assert Node.objects.get(name=NODE).health != NodeHealth.UNHEALTHY
