"""deploy/slurm hooks on the real clusters: slurmctld itself runs them against a live server.

The session's cluster gets ``EpilogSlurmctld`` for this module only: slurm.conf gains the line
and slurmctld is restarted (Slurm 22.05 reads EpilogSlurmctld at start, not on reconfigure;
running jobs and state survive a restart). The configured program is a two-line wrapper that
names this test's hook.env (``WR_HOOK_ENV``) and then runs deploy/slurm/epilog-slurmctld.sh with
the environment slurmctld gives it. At the end the line is removed and slurmctld restarted again.
On 24.11 slurmctld runs in the chroot, and so do the hooks, strigger and install-strigger.sh, as
they would on that cluster's controller.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from pytest_django.fixtures import Settings as SettingsWrapper

from recovery.choices import WorkloadState
from recovery.loop import scheduler_hooks
from recovery.loop.poll import poll_cluster
from recovery.models import AuditEvent, Cluster, IngestToken, IngestTokenKind, Workload
from tasks.polling import poll_cluster as poll_cluster_task
from tests.slurm.conftest import REPO, SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.django_db(transaction=True)]

EPILOG = REPO / "deploy" / "slurm" / "epilog-slurmctld.sh"
NODE_DOWN = REPO / "deploy" / "slurm" / "node-down.sh"
INSTALL_STRIGGER = REPO / "deploy" / "slurm" / "install-strigger.sh"


def _ctld_pid(cluster: SlurmCluster) -> int | None:
    return cluster.pid_of("slurmctld")


def _wait(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _restart_slurmctld(cluster: SlurmCluster) -> None:
    pid = _ctld_pid(cluster)
    if pid is not None:
        os.kill(pid, 15)
        _wait(lambda: not Path(f"/proc/{pid}").exists(), 15, "slurmctld to stop")
    started = cluster.run(["slurmctld"])
    assert started.returncode == 0, started.stdout + started.stderr

    def answers() -> bool:
        return " is UP" in cluster.run(["scontrol", "ping"], timeout=10).stdout

    _wait(answers, 20, "slurmctld to answer")


def _wrapper(path: Path, hook_env: Path, program: Path) -> Path:
    path.write_text(f'#!/bin/sh\nexport WR_HOOK_ENV="{hook_env}"\nexec "{program}" "$@"\n')
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def hook_env_file(slurm_cluster: SlurmCluster) -> Iterator[Path]:
    """slurm.conf with EpilogSlurmctld for this module; each test writes the hook.env it names."""
    etc = slurm_cluster.directory / "etc"
    hook_env = etc / f"wr-hook-{uuid.uuid4().hex[:6]}.env"
    wrapper = _wrapper(etc / "wr-epilog-slurmctld.sh", hook_env, EPILOG)
    original = slurm_cluster.conf.read_text()
    slurm_cluster.conf.write_text(original + f"\nEpilogSlurmctld={wrapper}\n")
    try:
        _restart_slurmctld(slurm_cluster)
        yield hook_env
    finally:
        slurm_cluster.conf.write_text(original)
        _restart_slurmctld(slurm_cluster)
        hook_env.unlink(missing_ok=True)


@pytest.fixture
def cluster(slurm_cluster: SlurmCluster) -> Cluster:
    connection, settings = slurm_cluster.connection()
    return Cluster.objects.create(name="lab", connection=connection, connection_settings=settings)


@pytest.fixture
def configured_hook(
    hook_env_file: Path, cluster: Cluster, live_server: Any, slurm_cluster: SlurmCluster
) -> Path:
    _, key = IngestToken.issue(
        cluster, IngestTokenKind.HOOK, name="slurmctld-hooks", issued_by="test"
    )
    hook_env_file.write_text(
        f"WR_HOOK_URL={live_server.url}\nWR_HOOK_TOKEN={key}\nWR_HOOK_TIMEOUT=5\n"
        f"WR_SLURM_CONF={slurm_cluster.conf}\n"
    )
    hook_env_file.chmod(0o600)
    return hook_env_file


@pytest.fixture
def poll_queue(settings: SettingsWrapper) -> Iterator[Callable[[], list[tuple[str, int]]]]:
    queue = f"wr-test-hooks-{uuid.uuid4().hex[:8]}"
    settings.CELERY_TASK_DEFAULT_QUEUE = queue
    connection = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    for key in connection.scan_iter("wr:hook-poll:*"):
        connection.delete(key)

    def queued() -> list[tuple[str, int]]:
        messages = [json.loads(raw) for raw in connection.lrange(queue, 0, -1)]
        return [
            (m["headers"]["task"], json.loads(base64.b64decode(m["body"]))[0][0]) for m in messages
        ]

    yield queued
    connection.delete(queue)


def _poll_until(cluster: Cluster, job_id: str, reached: Callable[[Workload], bool]) -> Workload:
    deadline = time.monotonic() + 60
    while True:
        poll_cluster(cluster)
        workload = Workload.objects.filter(cluster=cluster, job_id=job_id).first()
        if workload is not None and reached(workload):
            return workload
        assert time.monotonic() < deadline, f"never reached: {workload and workload.state}"
        time.sleep(0.3)


def _hook_events(**payload: Any) -> list[AuditEvent]:
    lookups = {f"payload__{key}": value for key, value in payload.items()}
    return list(AuditEvent.objects.filter(kind=scheduler_hooks.HOOK_EVENT_KIND, **lookups))


def test_slurmctld_runs_the_epilog_which_records_the_job_end_and_queues_a_poll(
    configured_hook: Path,
    cluster: Cluster,
    submit_job: Any,
    poll_queue: Callable[[], list[tuple[str, int]]],
) -> None:
    """
    GIVEN EpilogSlurmctld set to deploy/slurm/epilog-slurmctld.sh and a live server
    WHEN an opted-in job dies with exit code 1
    THEN slurmctld runs the epilog, which posts job-ended: the workload gets the record with
         Slurm's exit codes and nodes, a poll of the cluster is queued, and that poll (run here)
         reads the failed state from Slurm
    """
    submitted = submit_job({"STEP_SECONDS": "0.3", "FAIL_AT_STEP": "8", "TOTAL_STEPS": "50"})
    job_id = str(submitted.job_id)
    workload = _poll_until(cluster, job_id, lambda w: w.state == WorkloadState.RUNNING)

    _wait(lambda: bool(_hook_events(event="job_ended", job_id=job_id)), 40, "the epilog's POST")

    (event,) = _hook_events(event="job_ended", job_id=job_id)
    assert event.workload_id == workload.pk
    assert event.actor == "hook:slurmctld-hooks"
    assert event.payload["exit_code"] == 256  # raw wait status: exit 1
    assert event.payload["exit_code_text"] == "1:0"
    assert event.payload["restart_count"] == 0
    assert event.payload["nodes"] and set(event.payload["nodes"]) <= {
        "node001",
        "node002",
        "node003",
        "node004",
    }
    # The poll is queued once the hook's transaction commits, a moment after the event shows.
    _wait(lambda: bool(poll_queue()), 10, "the queued poll")
    assert poll_queue() == [("tasks.polling.poll_cluster", cluster.pk)]

    poll_cluster_task(cluster.pk)
    # The epilog runs while Slurm still shows the job COMPLETING, so the queued poll may come
    # before the end is readable; the polls after it must read FAILED.
    workload = _poll_until(cluster, job_id, lambda w: w.state == WorkloadState.FAILED)
    assert workload.state == WorkloadState.FAILED


def test_the_epilog_exits_0_when_the_service_is_away(
    hook_env_file: Path, slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """Run by hand with slurmctld's variables and an unreachable URL: quick, logged, exit 0."""
    hook_env = tmp_path / "hook.env"
    hook_env.write_text("WR_HOOK_URL=http://127.0.0.1:9/\nWR_HOOK_TOKEN=wrh_abc\n")
    env = {
        "WR_HOOK_ENV": str(hook_env),
        "SLURM_JOB_ID": "123",
        "SLURM_JOB_EXIT_CODE": "768",
        "SLURM_JOB_EXIT_CODE2": "3:0",
        "SLURM_JOB_NODELIST": "node[001-002]",
        "SLURM_SCRIPT_CONTEXT": "epilog_slurmctld",
    }
    # Where slurmctld runs it: on this host (22.05), in the chroot (24.11).
    epilog = slurm_cluster.command([str(EPILOG)])
    started = time.monotonic()
    result = subprocess.run(
        epilog, env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0
    assert time.monotonic() - started < 10
    assert "failed" in result.stderr
    unconfigured = subprocess.run(
        epilog,
        env={**env, "WR_HOOK_ENV": str(tmp_path / "missing.env")},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert unconfigured.returncode == 0
    assert "not configured" in unconfigured.stderr


def test_a_strigger_node_down_trigger_posts_the_node(
    configured_hook: Path,
    cluster: Cluster,
    slurm_cluster: SlurmCluster,
    poll_queue: Callable[[], list[tuple[str, int]]],
) -> None:
    """
    GIVEN install-strigger.sh registered node-down.sh as a permanent node-down trigger
    WHEN an administrator sets node004 DOWN
    THEN slurmctld runs the program (within its 15 s trigger interval), which posts the node:
         one record, and a poll is queued
    """
    poll_cluster(cluster)  # the cluster's nodes become known
    etc = slurm_cluster.directory / "etc"
    wrapper = _wrapper(etc / "wr-node-down.sh", configured_hook, NODE_DOWN)
    installed = slurm_cluster.run([str(INSTALL_STRIGGER), str(wrapper)])
    assert installed.returncode == 0, installed.stdout + installed.stderr
    again = slurm_cluster.run([str(INSTALL_STRIGGER), str(wrapper)])
    assert "already set" in again.stdout
    try:
        down = slurm_cluster.run(
            ["scontrol", "update", "NodeName=node004", "State=DOWN", "Reason=wr hook test"]
        )
        assert down.returncode == 0, down.stderr
        _wait(lambda: bool(_hook_events(event="node_down", node="node004")), 45, "the trigger")
    finally:
        slurm_cluster.run(["scontrol", "update", "NodeName=node004", "State=RESUME"])
        listed = slurm_cluster.run(["strigger", "--get", "--node", "--down"])
        for line in listed.stdout.splitlines():
            if str(wrapper) in line:
                slurm_cluster.run(["strigger", "--clear", f"--id={line.split()[0]}"])
    (event,) = _hook_events(event="node_down", node="node004")
    assert event.payload["state"] == "DOWN"
    assert event.actor == "hook:slurmctld-hooks"
    _wait(lambda: ("tasks.polling.poll_cluster", cluster.pk) in poll_queue(), 10, "the poll")
