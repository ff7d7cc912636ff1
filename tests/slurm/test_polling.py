"""Polling the real Slurm clusters: a job becomes a workload; a requeue becomes attempt 2.

Each cluster is polled as the project reaches it: local commands for 22.05, SSH for 24.11."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from recovery.choices import AttemptExitState, AuditKind, WorkloadState
from recovery.loop.poll import adapter_for, poll_cluster
from recovery.models import Attempt, AuditEvent, Cluster, Workload
from tasks.polling import poll_cluster as poll_cluster_task
from tests.slurm.conftest import SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.django_db]


@pytest.fixture
def cluster(slurm_cluster: SlurmCluster) -> Cluster:
    connection, settings = slurm_cluster.connection()
    return Cluster.objects.create(name="lab", connection=connection, connection_settings=settings)


def poll_until(cluster: Cluster, job_id: str, reached: Callable[[Workload], bool]) -> Workload:
    deadline = time.monotonic() + 60
    while True:
        poll_cluster(cluster)
        workload = Workload.objects.filter(cluster=cluster, job_id=job_id).first()
        if workload is not None and reached(workload):
            return workload
        assert time.monotonic() < deadline, f"never reached: {workload and workload.state}"
        time.sleep(0.3)


def test_a_real_job_and_its_requeue(cluster: Cluster, submit_job: Any) -> None:
    submitted = submit_job({"STEP_SECONDS": "0.2", "TOTAL_STEPS": "1000"})
    job_id = str(submitted.job_id)
    workload = poll_until(cluster, job_id, lambda w: w.state == WorkloadState.RUNNING)
    first_nodes = Attempt.objects.get(workload=workload, number=1).nodes
    assert first_nodes
    assert workload.opted_in and workload.environment == "test"

    adapter_for(cluster).requeue(job_id)
    poll_until(cluster, job_id, lambda w: w.current_attempt == 2)
    workload = poll_until(cluster, job_id, lambda w: w.state == WorkloadState.RUNNING)

    first = Attempt.objects.get(workload=workload, number=1)
    assert first.nodes == first_nodes  # kept, though Slurm forgot them on requeue
    assert first.exit_state == AttemptExitState.REQUEUED
    assert Attempt.objects.get(workload=workload, number=2).nodes
    assert (
        AuditEvent.objects.filter(workload=workload, kind=AuditKind.RESTART_ALLOCATED).count() == 1
    )


def test_the_task_polls_a_cluster(cluster: Cluster, submit_job: Any) -> None:
    submit_job()
    summary = poll_cluster_task(cluster.pk)
    assert summary["jobs_seen"] >= 1
    assert summary["nodes_seen"] >= 4
    cluster.refresh_from_db()
    assert cluster.last_polled_at is not None


def test_a_failing_jobs_output_is_read_into_anomalies_and_checkpoints(
    cluster: Cluster, submit_job: Any
) -> None:
    """
    GIVEN a real job that saves checkpoints and then dies of a CUDA out-of-memory error
    WHEN the cluster is polled
    THEN its output is read: a gpu_oom anomaly, the checkpoint steps and the failed state
    """
    from recovery.models import Anomaly

    submitted = submit_job({"STEP_SECONDS": "0.1", "CKPT_EVERY": "3", "FAIL_AT_STEP": "8"})
    workload = poll_until(cluster, str(submitted.job_id), lambda w: w.state == WorkloadState.FAILED)
    poll_cluster(cluster)  # the last lines may arrive after the state change
    anomaly = Anomaly.objects.get(workload=workload)
    assert (anomaly.category, anomaly.attribution) == ("gpu_oom", "application")
    workload.refresh_from_db()
    assert workload.last_checkpoint_step == 6
    assert workload.last_progress_step is not None and workload.last_progress_step >= 7
    assert AuditEvent.objects.filter(workload=workload, kind=AuditKind.DETECTED).count() == 1


def test_an_xid_in_a_nodes_kernel_log_reaches_the_job_running_there(
    slurm_cluster: SlurmCluster, submit_job: Any, tmp_path: Any
) -> None:
    from recovery.models import Anomaly

    connection, settings = slurm_cluster.connection()
    cluster = Cluster.objects.create(
        name="lab-kernel",
        connection=connection,
        connection_settings={**settings, "node_kernel_log": str(tmp_path / "kern-{node}.log")},
    )
    submitted = submit_job({"STEP_SECONDS": "0.2", "TOTAL_STEPS": "1000"})
    workload = poll_until(
        cluster, str(submitted.job_id), lambda w: w.state == WorkloadState.RUNNING
    )
    (node,) = Attempt.objects.get(workload=workload, number=1).nodes
    (tmp_path / f"kern-{node}.log").write_text(
        f"Nov 29 10:00:00 {node} kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid=1, "
        "An uncorrectable double bit error (DBE) has been detected on GPU.\n"
    )
    poll_cluster(cluster)
    anomaly = Anomaly.objects.get(workload=workload)
    assert (anomaly.category, anomaly.attribution) == ("gpu_hardware", "hardware")
    assert anomaly.implicated_nodes == [node]


def test_a_second_poll_of_the_same_cluster_waits_its_turn(cluster: Cluster) -> None:
    import redis
    from django.conf import settings

    lock = redis.Redis.from_url(settings.REDIS_URL).lock(f"wr:poll:{cluster.pk}", timeout=30)
    assert lock.acquire()
    try:
        assert poll_cluster_task(cluster.pk) == {"skipped": 1}
    finally:
        lock.release()
    assert "jobs_seen" in poll_cluster_task(cluster.pk)
