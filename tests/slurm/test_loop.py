"""The loop on real Slurm: a job fails, the poller detects and attributes it, the policy
recommends, the controller restarts it, and it completes from its checkpoint."""

from __future__ import annotations

import time
from typing import Any

import pytest

from recovery.choices import AuditKind, ClusterMode, RecommendationStatus, WorkloadState
from recovery.controller.client import AdvisorClient
from recovery.controller.controller import AdvisorController
from recovery.loop.poll import adapter_for, poll_cluster
from recovery.models import (
    Anomaly,
    AuditEvent,
    Cluster,
    ControllerToken,
    Policy,
    Recommendation,
    Workload,
)
from tests.slurm.conftest import SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.django_db(transaction=True, reset_sequences=True)]


def poll_until(cluster: Cluster, job_id: str, reached: Any, seconds: float = 60) -> Workload:
    deadline = time.monotonic() + seconds
    while True:
        poll_cluster(cluster)
        workload = Workload.objects.filter(cluster=cluster, job_id=job_id).first()
        if workload is not None and reached(workload):
            return workload
        assert time.monotonic() < deadline, f"never reached: {workload and workload.state}"
        time.sleep(0.3)


def test_a_failed_job_is_detected_recommended_restarted_and_completes(
    live_server: Any, slurm_cluster: SlurmCluster, submit_job: Any
) -> None:
    connection, settings = slurm_cluster.connection()
    cluster = Cluster.objects.create(
        name="lab-loop",
        connection=connection,
        connection_settings=settings,
        mode=ClusterMode.ACTION,
        acknowledge_scheduler_actions=True,
    )
    # Earlier tests' jobs are still in Slurm's memory and get polled too: the default policy
    # here only records, and this job's own environment gets the restarting policy.
    Policy.objects.create(name="record only", cluster=cluster, crash_action="none")
    Policy.objects.create(
        name="loop", cluster=cluster, environment="loop", blast_radius_percent=100
    )
    _, key = ControllerToken.issue(cluster, "loop-advisor")
    controller = AdvisorController(
        AdvisorClient(live_server.url, key), adapter_for(cluster), poll_seconds=0.2
    )
    submitted = submit_job(
        {"STEP_SECONDS": "0.1", "CKPT_EVERY": "3", "FAIL_AT_STEP": "8", "TOTAL_STEPS": "14"},
        comment={"nvidia-recovery": {"environment": "loop", "mode": "act"}},
    )
    job_id = str(submitted.job_id)

    poll_until(cluster, job_id, lambda w: w.state == WorkloadState.FAILED)
    poll_cluster(cluster)
    anomaly = Anomaly.objects.get(workload__job_id=job_id)
    assert anomaly.category == "gpu_oom"
    assert anomaly.verdicts.get().attribution == "application"
    recommendation = Recommendation.objects.get(workload__job_id=job_id)
    event = AuditEvent.objects.get(kind=AuditKind.RECOMMENDED, workload__job_id=job_id)
    assert recommendation.status == RecommendationStatus.READY, event.payload
    assert recommendation.action == "restart", (
        recommendation.exclusion_sources,
        recommendation.reason,
    )

    assert controller.run_once() == [(recommendation.pk, "executed")]
    workload = poll_until(cluster, job_id, lambda w: w.state == WorkloadState.COMPLETED)
    assert workload.current_attempt == 2
    assert "resuming from checkpoint at iteration" in submitted.output.read_text()

    kinds = set(AuditEvent.objects.filter(workload=workload).values_list("kind", flat=True))
    assert {
        AuditKind.DETECTED,
        AuditKind.ATTRIBUTED,
        AuditKind.RECOMMENDED,
        AuditKind.CLAIMED,
        AuditKind.SCHEDULER_ACTION,
        AuditKind.TRAINING_COMPLETED,
    } <= kinds
    assert controller.run_once() == []
