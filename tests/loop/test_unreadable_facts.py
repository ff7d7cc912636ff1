"""Scheduler facts that cannot be read and node names that cannot be real change nothing.

An unknown restart count, state, submit time or user neither creates nor changes a workload
(the fixed-format fallback used to report restart count 0, so every requeued job became a new
workload). A node name taken from a job's output that Slurm could not have given is dropped
where the anomaly is recorded, and the reason kept with it.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from django.utils import timezone

from recovery.choices import AuditKind, EvidenceSource, RecommendationAction
from recovery.detection.findings import Finding
from recovery.loop.anomalies import record_anomalies
from recovery.loop.poll import poll_cluster
from recovery.models import Anomaly, Attempt, AuditEvent, Recommendation, Workload
from tests.factories import AttemptFactory, ClusterFactory, WorkloadFactory
from tests.fakes import SUBMITTED, Scripted, job

pytestmark = pytest.mark.django_db

FIXED_FORMAT = "the fixed squeue format has no restart count"


def test_a_job_whose_restart_count_is_unknown_is_left_as_it_was() -> None:
    cluster = ClusterFactory()
    poll_cluster(cluster, Scripted([job()]))
    requeued_unreadable = job(
        state="RUNNING",
        nodes=["node003"],
        restart_count=None,
        submit_time=SUBMITTED + timedelta(minutes=9),  # Slurm reset it on requeue
        unreadable={"restart_count": FIXED_FORMAT},
    )
    summary = poll_cluster(cluster, Scripted([requeued_unreadable]))
    assert Workload.objects.count() == 1  # not a new workload
    assert Attempt.objects.count() == 1
    assert summary.ignored == 1
    assert FIXED_FORMAT in summary.unreadable[0]
    # And once the count can be read again, the restart is seen for what it is.
    poll_cluster(cluster, Scripted([replace(requeued_unreadable, restart_count=1, unreadable={})]))
    assert Workload.objects.count() == 1
    assert Workload.objects.get().current_attempt == 2


@pytest.mark.parametrize("unknown", ["phase", "submit_time", "held", "user"])
def test_no_workload_is_created_from_a_job_with_an_unknown_fact(unknown: str) -> None:
    cluster = ClusterFactory()
    value = "" if unknown == "user" else None
    summary = poll_cluster(
        cluster, Scripted([job(**{unknown: value, "unreadable": {unknown: "unknown shape"}})])
    )
    assert not Workload.objects.exists()
    assert summary.ignored == 1


def test_a_job_with_unknown_facts_is_still_listed_so_its_workload_is_not_closed() -> None:
    cluster = ClusterFactory()
    poll_cluster(cluster, Scripted([job()]))
    poll_cluster(cluster, Scripted([job(state=None, unreadable={"phase": "unknown shape"})]))
    assert Workload.objects.get().state == "running"
    assert not AuditEvent.objects.filter(payload__to="unknown").exists()


def test_node_names_no_scheduler_could_give_are_dropped_and_the_reason_kept() -> None:
    cluster = ClusterFactory(mode="action", acknowledge_scheduler_actions=True)
    workload = WorkloadFactory(cluster=cluster, opted_in=True, current_attempt=1)
    attempt = AttemptFactory(workload=workload, number=1, nodes=["gpu-007", "gpu-008"])
    finding = Finding(
        kind="crash",
        category="gpu_hardware",
        attribution="hardware",
        severity="fatal",
        signature="xid-79",
        evidence="NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
        nodes=["-h", "gpu$(id)", "x" * 100, "gpu-007"],
        detail={"role": "cause", "xid": 79},
    )
    record_anomalies(
        workload,
        attempt,
        [finding],
        timezone.now(),
        scope="kernel:gpu-007",
        source=EvidenceSource.KERNEL_LOG,
    )
    anomaly = Anomaly.objects.get()
    assert anomaly.implicated_nodes == ["gpu-007"]
    ignored = anomaly.details["ignored_nodes"]
    assert [entry["value"] for entry in ignored][:2] == ["'-h'", "'gpu$(id)'"]
    assert "starts with '-'" in ignored[0]["reason"]
    assert "longer than 64" in ignored[2]["reason"]
    detected = AuditEvent.objects.get(kind=AuditKind.DETECTED)
    assert len(detected.payload["ignored_nodes"]) == 3
    recommended = Recommendation.objects.filter(action=RecommendationAction.RESTART_EXCLUDING)
    assert [r.excluded_nodes for r in recommended] == [["gpu-007"]]
