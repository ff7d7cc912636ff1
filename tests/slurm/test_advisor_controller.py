"""The Advisor Controller on the real Slurm clusters, through the real Advisor API over HTTP.

It reaches each cluster as the project does: local commands for 22.05, SSH for 24.11."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from recovery.choices import AuditKind, ClusterMode, RecommendationAction, RecommendationStatus
from recovery.controller.client import AdvisorClient
from recovery.controller.controller import AdvisorController
from recovery.loop import recommendations
from recovery.models import Attempt, AuditEvent, Cluster, ControllerToken, Recommendation, Workload
from recovery.schedulers.base import JobInfo
from recovery.schedulers.slurm import SlurmAdapter
from tests.slurm.conftest import SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.django_db(transaction=True, reset_sequences=True)]

FAST = {"STEP_SECONDS": "0.2", "CKPT_EVERY": "3", "TOTAL_STEPS": "1000"}
RESUMED = re.compile(r"resuming from checkpoint at iteration\s+(\d+)")


@pytest.fixture
def adapter(slurm_cluster: SlurmCluster) -> Iterator[SlurmAdapter]:
    adapter = slurm_cluster.adapter()
    yield adapter
    close = getattr(adapter.transport, "close", None)
    if close is not None:
        close()


@pytest.fixture
def cluster(slurm_cluster: SlurmCluster) -> Cluster:
    connection, settings = slurm_cluster.connection()
    return Cluster.objects.create(
        name="lab",
        connection=connection,
        connection_settings=settings,
        mode=ClusterMode.ACTION,
        acknowledge_scheduler_actions=True,
    )


@pytest.fixture
def controller(live_server: Any, cluster: Cluster, adapter: SlurmAdapter) -> AdvisorController:
    _, key = ControllerToken.issue(cluster, "slurm-advisor-1")
    return AdvisorController(
        AdvisorClient(live_server.url, key), adapter, settle_seconds=30, poll_seconds=0.2
    )


def wait_for(adapter: SlurmAdapter, job_id: str, reached: Callable[[JobInfo], bool]) -> JobInfo:
    deadline = time.monotonic() + 60
    while True:
        job = adapter.get_job(job_id)
        if job is not None and reached(job):
            return job
        assert time.monotonic() < deadline, f"job {job_id} never got there: {job}"
        time.sleep(0.2)


def running_job_with_checkpoint(submit_job: Any, adapter: SlurmAdapter) -> tuple[Any, JobInfo]:
    submitted = submit_job(FAST)
    job = wait_for(adapter, str(submitted.job_id), lambda j: j.is_running)
    deadline = time.monotonic() + 30
    while not list(submitted.ckpt_dir.glob("step_*")):
        assert time.monotonic() < deadline, "no checkpoint written"
        time.sleep(0.1)
    return submitted, job


def recommend_restart(cluster: Cluster, job: JobInfo, status: str) -> Recommendation:
    workload = Workload.objects.create(
        cluster=cluster,
        job_id=job.job_id,
        submit_time=job.submit_time or timezone.now(),
        user=job.user,
        partition=job.partition,
        opted_in=True,
        current_attempt=1,
    )
    attempt = Attempt.objects.create(
        workload=workload, number=1, nodes=job.nodes, started_at=job.start_time
    )
    return Recommendation.objects.create(
        workload=workload,
        attempt=attempt,
        action=RecommendationAction.RESTART_EXCLUDING,
        excluded_nodes=job.nodes,
        reason="Xid 79 on the first node",
        status=status,
        idempotency_key=f"test:{job.job_id}:1",
    )


def test_an_action_mode_restart_happens_once_and_resumes_elsewhere(
    controller: AdvisorController, cluster: Cluster, adapter: SlurmAdapter, submit_job: Any
) -> None:
    """
    GIVEN a running job with a checkpoint and a ready restart-excluding recommendation
    WHEN the controller runs, and runs again
    THEN the job restarts once, away from its node, from its checkpoint, and it is all audited
    """
    submitted, job = running_job_with_checkpoint(submit_job, adapter)
    recommendation = recommend_restart(cluster, job, RecommendationStatus.READY)

    assert controller.run_once() == [(recommendation.pk, "executed")]
    assert controller.run_once() == []

    restarted = wait_for(adapter, job.job_id, lambda j: j.is_running and j.restart_count == 1)
    assert not set(restarted.nodes) & set(job.nodes)
    assert restarted.excluded_nodes is not None
    assert set(job.nodes) <= set(restarted.excluded_nodes)
    deadline = time.monotonic() + 30
    while not RESUMED.search(submitted.output.read_text()):
        assert time.monotonic() < deadline, submitted.output.read_text()[-2000:]
        time.sleep(0.2)
    assert int(RESUMED.search(submitted.output.read_text()).group(1)) > 0  # type: ignore[union-attr]

    recommendation.refresh_from_db()
    assert recommendation.status == RecommendationStatus.EXECUTED
    assert recommendation.result["converged"] is True
    action = AuditEvent.objects.get(kind=AuditKind.SCHEDULER_ACTION)
    argvs = [command["argv"][:2] for command in action.payload["commands"]]
    assert argvs == [["scontrol", "requeuehold"], ["scontrol", "update"], ["scontrol", "release"]]
    assert action.payload["state_before"]["job_state"] == "RUNNING"


def test_a_controller_killed_half_way_is_finished_by_the_next_without_a_second_restart(
    controller: AdvisorController, cluster: Cluster, adapter: SlurmAdapter, submit_job: Any
) -> None:
    """
    GIVEN a controller that claimed a restart, requeued the job held, and died
    WHEN its lease has expired and another controller runs
    THEN the job is not requeued again: the exclusion is set and it is released, once
    """
    _, job = running_job_with_checkpoint(submit_job, adapter)
    recommendation = recommend_restart(cluster, job, RecommendationStatus.READY)
    recommendations.claim(
        recommendation.pk, controller="controller:dead", instance="dead-1", lease_seconds=60
    )
    adapter.requeue(job.job_id, hold=True)
    Recommendation.objects.filter(pk=recommendation.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )

    assert controller.run_once() == [(recommendation.pk, "executed")]

    restarted = wait_for(adapter, job.job_id, lambda j: j.is_running)
    assert restarted.restart_count == 1
    assert not set(restarted.nodes) & set(job.nodes)
    action = AuditEvent.objects.get(kind=AuditKind.SCHEDULER_ACTION)
    assert [c["argv"][1] for c in action.payload["commands"]] == ["update", "release"]


def test_monitor_mode_waits_for_an_approval_then_acts_once(
    controller: AdvisorController, cluster: Cluster, adapter: SlurmAdapter, submit_job: Any
) -> None:
    cluster.mode = ClusterMode.MONITOR
    cluster.save()
    _, job = running_job_with_checkpoint(submit_job, adapter)
    recommendation = recommend_restart(cluster, job, RecommendationStatus.AWAITING_APPROVAL)

    assert controller.run_once() == []
    assert adapter.get_job(job.job_id).restart_count == 0  # type: ignore[union-attr]

    recommendations.approve(recommendation.pk, operator="otto")
    assert controller.run_once() == [(recommendation.pk, "executed")]
    assert controller.run_once() == []
    assert wait_for(adapter, job.job_id, lambda j: j.is_running).restart_count == 1


def test_an_already_restarted_job_is_reported_skipped(
    controller: AdvisorController, cluster: Cluster, adapter: SlurmAdapter, submit_job: Any
) -> None:
    _, job = running_job_with_checkpoint(submit_job, adapter)
    recommendation = recommend_restart(cluster, job, RecommendationStatus.READY)
    adapter.requeue(job.job_id, hold=True)
    wait_for(adapter, job.job_id, lambda j: j.is_pending)
    adapter.set_excluded_nodes(job.job_id, job.nodes)
    adapter.release(job.job_id)

    assert controller.run_once() == [(recommendation.pk, "skipped")]
    assert AuditEvent.objects.filter(kind=AuditKind.ACTION_SKIPPED).count() == 1
    assert wait_for(adapter, job.job_id, lambda j: j.is_running).restart_count == 1


def test_a_controller_killed_twenty_times_restarts_the_job_exactly_once(
    live_server: Any, cluster: Cluster, adapter: SlurmAdapter, submit_job: Any,
    slurm_cluster: SlurmCluster, tmp_path: Any,
) -> None:  # fmt: skip
    """
    GIVEN a ready restart for a running job
    WHEN the controller process is SIGKILLed at a random moment, twenty times, each time its
         lease is let run out, and then it runs to the end
    THEN the job has been restarted exactly once, away from its node, and the trail says so once
    """
    import os
    import random
    import signal
    import subprocess
    import sys

    from django.conf import settings

    _, job = running_job_with_checkpoint(submit_job, adapter)
    recommendation = recommend_restart(cluster, job, RecommendationStatus.READY)
    _, key = ControllerToken.issue(cluster, "killable")
    token_file = tmp_path / "token"
    token_file.write_text(key)
    command = [
        sys.executable, "manage.py", "advisor_controller", "--cluster", "lab", "--once",
        "--url", live_server.url, "--token-file", str(token_file),
        "--lease-seconds", "10", *slurm_cluster.controller_args(),
    ]  # fmt: skip
    rng = random.Random(20261129)
    for _ in range(20):
        process = subprocess.Popen(
            command, cwd=settings.BASE_DIR, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        time.sleep(rng.uniform(0.2, 2.5))
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        # The lease of a killed controller runs out; skip the wait.
        Recommendation.objects.filter(
            pk=recommendation.pk, status=RecommendationStatus.CLAIMED
        ).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    finished = subprocess.run(
        command, cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=120
    )
    assert finished.returncode == 0, finished.stderr

    recommendation.refresh_from_db()
    assert recommendation.status in {RecommendationStatus.EXECUTED, RecommendationStatus.SKIPPED}
    final = wait_for(adapter, job.job_id, lambda j: j.is_running)
    assert final.restart_count == 1
    assert not set(final.nodes) & set(job.nodes)
    reports = AuditEvent.objects.filter(
        kind__in=[AuditKind.SCHEDULER_ACTION, AuditKind.ACTION_SKIPPED, AuditKind.ACTION_FAILED]
    )
    assert reports.count() == 1
    requeues = [
        event
        for event in AuditEvent.objects.filter(kind=AuditKind.SCHEDULER_ACTION)
        if any(c["argv"][1] in {"requeue", "requeuehold"} for c in event.payload["commands"])
    ]
    assert len(requeues) <= 1


def test_a_partition_outside_the_allowlist_is_left_alone(
    live_server: Any, cluster: Cluster, adapter: SlurmAdapter, submit_job: Any
) -> None:
    _, key = ControllerToken.issue(cluster, "canary-only")
    canary_only = AdvisorController(
        AdvisorClient(live_server.url, key), adapter, partitions=["canary"]
    )
    _, job = running_job_with_checkpoint(submit_job, adapter)
    recommendation = recommend_restart(cluster, job, RecommendationStatus.READY)
    assert job.partition == "debug"
    assert canary_only.run_once() == []
    recommendation.refresh_from_db()
    assert recommendation.status == RecommendationStatus.READY
    assert adapter.get_job(job.job_id).restart_count == 0  # type: ignore[union-attr]
