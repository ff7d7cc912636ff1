"""A tenant with a job tries to act on other users' jobs through the ingest and Advisor APIs.

The tenant holds what a job can hold: a job token for its own job (or its own user). Each abuse
is refused with a clear error and leaves every stored row as it was.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.urls import reverse
from django.utils import timezone
from pytest_django.fixtures import Settings as SettingsWrapper
from rest_framework.test import APIClient

from api.authentication import CONTROLLER_ONLY, NO_CONTROLLER_PUSH
from recovery.choices import Connection, RecommendationStatus
from recovery.models import (
    Cluster,
    ControllerToken,
    IngestToken,
    IngestTokenKind,
    Recommendation,
    Workload,
)
from tests.factories import AttemptFactory, ClusterFactory, RecommendationFactory, WorkloadFactory

pytestmark = pytest.mark.django_db

HEARTBEATS = reverse("api:ingest-heartbeats")
LOGS = reverse("api:ingest-logs")
JOB_ENDED = reverse("api:ingest-job-ended")
NODE_DOWN = reverse("api:ingest-node-down")
HOOK_COMMON = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "hook-common.sh"


def victim_line(job_id: str) -> str:
    # What slurmstepd prints when a node fails under a job: a scheduler fact, if the scheduler
    # printed it, but here the tenant's own program prints it.
    return (
        f"slurmstepd: error: *** JOB {job_id} ON gpu-7 CANCELLED AT 2026-12-01T10:00:00 DUE TO "
        "NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***"
    )


def bearer(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def stored_rows() -> dict[str, int]:
    """Row counts of every model of the project, to show an abuse changed nothing."""
    counts = {}
    for model in apps.get_app_config("recovery").get_models():
        if model is IngestToken:
            continue  # its last_used_at is the one thing a refused call may touch
        counts[model.__name__] = model._default_manager.count()
    return counts


@pytest.fixture
def cluster() -> Cluster:
    return ClusterFactory(name="shared", connection=Connection.SIMULATED)


@pytest.fixture
def tenant_job(cluster: Cluster) -> Workload:
    workload = WorkloadFactory(cluster=cluster, job_id="5001", user="mallory")
    AttemptFactory(workload=workload, number=1, nodes=["gpu-3"])
    return workload


@pytest.fixture
def victim_job(cluster: Cluster) -> Workload:
    workload = WorkloadFactory(cluster=cluster, job_id="5002", user="alice")
    AttemptFactory(workload=workload, number=1, nodes=["gpu-7"])
    return workload


@pytest.fixture
def tenant(tenant_job: Workload) -> APIClient:
    """The tenant's job token, issued for its own job as an operator would."""
    _, key = IngestToken.issue(
        tenant_job.cluster,
        IngestTokenKind.JOB,
        name="job-5001",
        issued_by="olga",
        job_id=tenant_job.job_id,
        job_submit_time=tenant_job.submit_time,
    )
    return bearer(key)


@pytest.fixture
def tenant_by_user(tenant_job: Workload) -> APIClient:
    _, key = IngestToken.issue(
        tenant_job.cluster,
        IngestTokenKind.JOB,
        name="user-mallory",
        issued_by="olga",
        user="mallory",
    )
    return bearer(key)


def assert_refused(response: Any, status: int, words: str) -> None:
    assert response.status_code == status, response.content
    body = response.json()
    assert words in body["error"]
    assert body["detail"] == body["error"]


@pytest.mark.parametrize("which", ["tenant", "tenant_by_user"])
def test_a_job_token_cannot_push_a_node_failure_for_another_users_job(
    which: str, victim_job: Workload, request: pytest.FixtureRequest
) -> None:
    client: APIClient = request.getfixturevalue(which)
    before = stored_rows()
    response = client.post(
        LOGS,
        {"job_id": victim_job.job_id, "lines": [victim_line(victim_job.job_id)]},
        format="json",
    )
    assert_refused(response, 403, f"not for job {victim_job.job_id}")
    assert stored_rows() == before


def test_a_job_token_cannot_push_heartbeats_or_checkpoints_for_another_job(
    tenant: APIClient, tenant_job: Workload, victim_job: Workload
) -> None:
    before = stored_rows()
    # One heartbeat of its own and one for the victim: the whole batch is refused.
    batch = [
        {"job_id": tenant_job.job_id, "step": 10},
        {"job_id": victim_job.job_id, "step": 10**12, "checkpoint_step": 10**12},
    ]
    assert_refused(tenant.post(HEARTBEATS, batch, format="json"), 403, "may push for job 5001")
    assert stored_rows() == before
    victim_job.refresh_from_db()
    assert victim_job.last_checkpoint_step is None


def test_a_job_token_does_not_match_a_later_job_that_reuses_the_id(
    tenant: APIClient, tenant_job: Workload
) -> None:
    # Slurm reuses ids after a reset: a newer job with the same id is another user's job.
    WorkloadFactory(
        cluster=tenant_job.cluster,
        job_id=tenant_job.job_id,
        user="alice",
        submit_time=tenant_job.submit_time + timedelta(days=3),
    )
    before = stored_rows()
    response = tenant.post(HEARTBEATS, {"job_id": tenant_job.job_id, "step": 5}, format="json")
    assert_refused(response, 403, "not for job 5001")
    assert stored_rows() == before


def test_a_job_token_pushes_for_its_own_job(tenant: APIClient, tenant_job: Workload) -> None:
    response = tenant.post(HEARTBEATS, {"job_id": tenant_job.job_id, "step": 7}, format="json")
    assert response.status_code == 200
    tenant_job.refresh_from_db()
    assert tenant_job.last_progress_step == 7


@pytest.mark.parametrize("url", [JOB_ENDED, NODE_DOWN])
def test_a_job_token_cannot_push_scheduler_events(
    url: str, tenant: APIClient, victim_job: Workload
) -> None:
    before = stored_rows()
    body = {"job_id": victim_job.job_id, "state": "NODE_FAIL", "node": "gpu-7"}
    assert_refused(tenant.post(url, body, format="json"), 403, "take a hook token")
    assert stored_rows() == before


@pytest.mark.parametrize("url", [HEARTBEATS, LOGS])
def test_a_hook_token_cannot_push_a_jobs_evidence(
    url: str, cluster: Cluster, victim_job: Workload
) -> None:
    _, key = IngestToken.issue(cluster, IngestTokenKind.HOOK, name="hooks", issued_by="root")
    before = stored_rows()
    body = {"job_id": victim_job.job_id, "step": 1, "lines": [victim_line(victim_job.job_id)]}
    assert_refused(bearer(key).post(url, body, format="json"), 403, "take a job token")
    assert stored_rows() == before


@pytest.mark.parametrize("url", [HEARTBEATS, LOGS, JOB_ENDED, NODE_DOWN])
def test_the_controller_token_may_not_push(
    url: str, cluster: Cluster, victim_job: Workload
) -> None:
    """A controller token copied into a job must not be a way to push for every job."""
    _, key = ControllerToken.issue(cluster, "slurm-advisor-1")
    before = stored_rows()
    body = {
        "job_id": victim_job.job_id,
        "step": 1,
        "lines": [victim_line(victim_job.job_id)],
        "state": "NODE_FAIL",
        "node": "gpu-7",
    }
    response = bearer(key).post(url, body, format="json")
    assert_refused(response, 403, "may not push to /api/v1/ingest/")
    assert response.json()["error"] == NO_CONTROLLER_PUSH
    assert stored_rows() == before


def _ready(cluster: Cluster) -> Recommendation:
    return RecommendationFactory(
        workload=WorkloadFactory(cluster=cluster, user="alice"), status=RecommendationStatus.READY
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda client, rec: client.get(reverse("api:advisor-ready")),
        lambda client, rec: client.get(reverse("api:advisor-identity")),
        lambda client, rec: client.post(reverse("api:advisor-claim", args=[rec.pk]), {}),
        lambda client, rec: client.post(reverse("api:advisor-renew", args=[rec.pk]), {}),
        lambda client, rec: client.post(
            reverse("api:advisor-report", args=[rec.pk]),
            {"outcome": "skipped", "reason": "suppressed"},
            format="json",
        ),
    ],
    ids=["ready", "identity", "claim", "renew", "report"],
)
@pytest.mark.parametrize("kind", [IngestTokenKind.JOB, IngestTokenKind.HOOK])
def test_job_and_hook_tokens_cannot_use_the_advisor_api(
    call: Callable[[APIClient, Recommendation], Any], kind: IngestTokenKind, cluster: Cluster
) -> None:
    recommendation = _ready(cluster)
    _, key = IngestToken.issue(
        cluster, kind, name="t", issued_by="olga", user="mallory" if kind == "job" else ""
    )
    before = stored_rows()
    response = call(bearer(key), recommendation)
    assert response.status_code == 403
    assert response.json()["error"] == CONTROLLER_ONLY
    assert stored_rows() == before
    recommendation.refresh_from_db()
    assert recommendation.status == RecommendationStatus.READY
    assert recommendation.lease_owner == ""


def test_a_job_spending_its_budget_does_not_throttle_the_controller(
    settings: SettingsWrapper, tenant: APIClient, tenant_job: Workload, cluster: Cluster
) -> None:
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {
            **settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"],
            "job_token": "3/minute",
            "controller": "3/minute",
        },
    }
    beat = {"job_id": tenant_job.job_id, "step": 1}
    statuses = [tenant.post(HEARTBEATS, beat, format="json").status_code for _ in range(5)]
    assert statuses == [200, 200, 200, 429, 429]
    _, key = ControllerToken.issue(cluster, "slurm-advisor-1")
    assert bearer(key).get(reverse("api:advisor-ready")).status_code == 200


def test_an_expired_job_token_is_refused(tenant_job: Workload) -> None:
    _, key = IngestToken.issue(
        tenant_job.cluster,
        IngestTokenKind.JOB,
        name="old",
        issued_by="olga",
        user="mallory",
        expires_at=timezone.now() - timedelta(minutes=1),
    )
    before = stored_rows()
    response = bearer(key).post(HEARTBEATS, {"job_id": tenant_job.job_id, "step": 3}, format="json")
    assert_refused(response, 401, "expired")
    assert stored_rows() == before


@pytest.mark.parametrize(
    ("token", "refusal"),
    [
        ("wrc_controller-key", "is a controller token (wrc_...), which may not push"),
        ("wrj_a-job-key", "is not a hook token (wrh_...)"),
    ],
)
def test_the_scheduler_hooks_refuse_a_token_that_is_not_a_hook_token(
    token: str, refusal: str, tmp_path: Path
) -> None:
    """A hook configured with another kind of token stops before any request, saying which
    token it needs (the server would refuse it too)."""
    hook_env = tmp_path / "hook.env"
    hook_env.write_text(f"WR_HOOK_URL=http://127.0.0.1:9/\nWR_HOOK_TOKEN={token}\n")
    hook_env.chmod(0o600)
    result = subprocess.run(
        ["bash", "-c", f"source {HOOK_COMMON}; hook_load_config; echo loaded=$?"],
        env={"PATH": os.environ["PATH"], "WR_HOOK_ENV": str(hook_env)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert "loaded=1" in result.stdout
    assert refusal in result.stderr
