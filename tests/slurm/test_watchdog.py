"""The watchdog on real Slurm: a job left held for a decision is released to normal scheduling."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from recovery.choices import AuditKind, WorkloadState
from recovery.loop.poll import adapter_for, poll_cluster
from recovery.loop.watchdog import run_watchdog
from recovery.models import AuditEvent, Cluster, Policy, Workload
from tests.slurm.conftest import SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.django_db(transaction=True)]


def poll_until(cluster: Cluster, job_id: str, state: str, seconds: float = 60) -> Workload:
    deadline = time.monotonic() + seconds
    while True:
        poll_cluster(cluster, ingest_logs=False)
        workload = Workload.objects.filter(cluster=cluster, job_id=job_id).first()
        if workload is not None and workload.state == state:
            return workload
        assert time.monotonic() < deadline, f"never {state}: {workload and workload.state}"
        time.sleep(0.3)


def test_a_job_held_past_the_decision_timeout_is_released(
    slurm_cluster: SlurmCluster, submit_job: Any
) -> None:
    connection, settings = slurm_cluster.connection()
    cluster = Cluster.objects.create(
        name="lab-watchdog", connection=connection, connection_settings=settings
    )
    Policy.objects.create(
        name="hold briefly", cluster=cluster, crash_action="none", decision_timeout_seconds=5
    )
    adapter = adapter_for(cluster)
    submitted = submit_job(
        {"TOTAL_STEPS": "600", "STEP_SECONDS": "0.1"},
        comment={"nvidia-recovery": {"environment": "watchdog", "mode": "act"}},
    )
    job_id = str(submitted.job_id)
    poll_until(cluster, job_id, WorkloadState.RUNNING)
    # What a site's hook (or a controller killed mid-restart) leaves behind: a held requeue.
    adapter.requeue(job_id, hold=True)
    poll_until(cluster, job_id, WorkloadState.HELD)

    assert run_watchdog(now=timezone.now()).released == 0  # not overdue yet
    later = timezone.now() + timedelta(seconds=6)
    assert run_watchdog(now=later).released == 1
    assert run_watchdog(now=later).released == 0

    job = adapter.get_job(job_id)
    assert job is not None and not job.held
    event = AuditEvent.objects.get(kind=AuditKind.WATCHDOG_RELEASED)
    assert event.payload["hold_reason"]  # Slurm says JobHeldUser when the owner requeued it
    workload = poll_until(cluster, job_id, WorkloadState.RUNNING)
    assert workload.current_attempt == 2
