"""The controller's own wheel, installed in a fresh virtual environment without Django, carries
out a restart on the real Slurm clusters (22.05 by its local commands, 24.11 over SSH) through the
real Advisor API, on the oldest and the newest Python it supports that this machine has."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from recovery.choices import AuditKind, RecommendationStatus
from recovery.models import AuditEvent, Cluster, ControllerToken, Recommendation
from recovery.schedulers.slurm import SlurmAdapter
from tests.controller_package_fixtures import ControllerVenv
from tests.slurm.conftest import SlurmCluster
from tests.slurm.test_advisor_controller import (
    recommend_restart,
    running_job_with_checkpoint,
    wait_for,
)

pytestmark = [
    pytest.mark.deploy,
    pytest.mark.django_db(transaction=True, reset_sequences=True),
]


@pytest.fixture
def adapter(slurm_cluster: SlurmCluster) -> Any:
    adapter = slurm_cluster.adapter()
    yield adapter
    close = getattr(adapter.transport, "close", None)
    if close is not None:
        close()


@pytest.mark.parametrize("minor", [9, 13], ids=lambda minor: f"py3.{minor}")
def test_the_installed_wheel_restarts_a_job_once(
    minor: int,
    controller_venv: Callable[[int], ControllerVenv],
    live_server: Any,
    slurm_cluster: SlurmCluster,
    adapter: SlurmAdapter,
    submit_job: Any,
    tmp_path: Path,
) -> None:
    """
    GIVEN a running job with a checkpoint and a ready restart-excluding recommendation
    WHEN the wheel's `workload-recovery-controller --once` runs, and runs again
    THEN the job is restarted once, away from its nodes, and the trail records the commands
    """
    venv = controller_venv(minor)
    connection, settings = slurm_cluster.connection()
    cluster = Cluster.objects.create(
        name="lab",
        connection=connection,
        connection_settings=settings,
        mode="action",
        acknowledge_scheduler_actions=True,
    )
    _, job = running_job_with_checkpoint(submit_job, adapter)
    recommendation = recommend_restart(cluster, job, RecommendationStatus.READY)
    _, key = ControllerToken.issue(cluster, f"login-node-py3{minor}")
    token_file = tmp_path / "token"
    token_file.write_text(key)
    token_file.chmod(0o600)
    command = [
        str(venv.script), "--cluster", "lab", "--once", "--url", live_server.url,
        "--token-file", str(token_file), *slurm_cluster.controller_args(),
    ]  # fmt: skip

    first = venv.run(command, timeout=180)
    assert first.returncode == 0, first.stderr
    assert f"recommendation {recommendation.pk}: executed" in first.stdout
    assert f"serves cluster lab (Slurm ClusterName {settings['scheduler_cluster_name']})" in (
        first.stdout
    )
    second = venv.run(command, timeout=180)
    assert second.returncode == 0, second.stderr
    assert "recommendation" not in second.stdout

    restarted = wait_for(adapter, job.job_id, lambda j: j.is_running and j.restart_count == 1)
    assert not set(restarted.nodes) & set(job.nodes)
    recommendation.refresh_from_db()
    assert recommendation.status == RecommendationStatus.EXECUTED
    action = AuditEvent.objects.get(kind=AuditKind.SCHEDULER_ACTION)
    assert action.actor == f"controller:login-node-py3{minor}"
    argvs = [command["argv"][:2] for command in action.payload["commands"]]
    assert argvs == [["scontrol", "requeuehold"], ["scontrol", "update"], ["scontrol", "release"]]
    assert Recommendation.objects.filter(status=RecommendationStatus.EXECUTED).count() == 1
