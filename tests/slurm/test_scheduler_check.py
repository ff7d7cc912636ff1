"""``manage.py scheduler_check`` against real Slurm 22.05 and 24.11, reached as the project
reaches each (local commands, SSH to a login node): a running opted-in job, then the same
job after a restart, which stays one workload with restart count 1."""

from __future__ import annotations

import json
import time
from datetime import datetime
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from recovery.choices import WorkloadState
from recovery.loop.poll import poll_cluster
from recovery.models import Cluster, Workload
from tests.slurm.conftest import SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.django_db]


def check(cluster: Cluster) -> dict[str, Any]:
    out = StringIO()
    call_command("scheduler_check", "--cluster", cluster.name, "--json", stdout=out)
    return json.loads(out.getvalue())  # type: ignore[no-any-return]


def job_in(report: dict[str, Any], job_id: int) -> dict[str, Any]:
    return next(job for job in report["jobs"] if job["job_id"] == str(job_id))


def submit_time_slurm_says(slurm_cluster: SlurmCluster, job_id: int) -> datetime:
    shown = slurm_cluster.run(["scontrol", "-o", "show", "job", str(job_id)]).stdout
    field = next(word for word in shown.split() if word.startswith("SubmitTime="))
    return datetime.fromisoformat(field.removeprefix("SubmitTime="))


def wait_for_state(cluster: Cluster, job_id: int, state: str, restarts: int) -> dict[str, Any]:
    deadline = time.monotonic() + 90
    while True:
        report = check(cluster)
        job = job_in(report, job_id)
        if job["state"] == state and job["restart_count"] == restarts:
            return report
        assert time.monotonic() < deadline, f"job never {state} after {restarts} restarts: {job}"
        time.sleep(0.5)


def test_a_running_job_and_its_restart_as_the_check_and_the_poller_see_them(
    slurm_cluster: SlurmCluster, submit_job: Any
) -> None:
    connection, settings = slurm_cluster.connection()
    cluster = Cluster.objects.create(
        name="lab",
        connection=connection,
        connection_settings=settings,
    )
    submitted = submit_job({"STEP_SECONDS": "0.2", "TOTAL_STEPS": "2000"})
    report = wait_for_state(cluster, submitted.job_id, "RUNNING", 0)
    assert report["slurm_version"].startswith(slurm_cluster.version)
    assert report["cluster_name"] == "dev" and report["errors"] == []
    job = job_in(report, submitted.job_id)
    assert job["opted_in"] is True
    assert job["nodes"] and job["excluded_nodes"] == []
    assert job["unreadable"] == {}
    # The real submit time, to the second, as Slurm itself prints it (in local time).
    submitted_at = datetime.fromisoformat(job["submit_time"])
    assert submitted_at.astimezone().replace(tzinfo=None) == submit_time_slurm_says(
        slurm_cluster, submitted.job_id
    )
    assert {node["name"] for node in report["nodes"]} >= set(slurm_cluster.nodes)

    poll_cluster(cluster, ingest_logs=False)
    assert Workload.objects.get(cluster=cluster, job_id=str(submitted.job_id)).state == (
        WorkloadState.RUNNING
    )
    requeued = slurm_cluster.run(["scontrol", "requeue", str(submitted.job_id)])
    assert requeued.returncode == 0, requeued.stderr
    slurm_cluster.run(["scontrol", "update", f"JobId={submitted.job_id}", "StartTime=now"])
    deadline = time.monotonic() + 90
    while True:
        poll_cluster(cluster, ingest_logs=False)
        workloads = list(Workload.objects.filter(cluster=cluster, job_id=str(submitted.job_id)))
        assert len(workloads) == 1, "a requeued job must stay one workload"
        if workloads[0].current_attempt == 2 and workloads[0].state == WorkloadState.RUNNING:
            break
        assert time.monotonic() < deadline, f"never running again: {workloads[0].state}"
        time.sleep(0.5)
    report = wait_for_state(cluster, submitted.job_id, "RUNNING", 1)
    assert job_in(report, submitted.job_id)["restart_count"] == 1
