"""A tenant's job token, and a controller token shared by two controllers, pushed past what
they are for.

- A job token could create any number of log streams (a row each) and push heartbeats by the
  thousand per request: its pushes are capped per job in streams and per minute in samples
  and log lines, refused with 429 and nothing stored.
- A job token naming a job id without a submit time also covered a later job that reused the
  id: job tokens bind the submit time (or a user), and one that does not covers no job.
- Two controllers sharing one controller token were one lease holder (the token's name): the
  lease is held by a controller process's instance id, so the other process cannot renew,
  dispatch or report on it.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone
from pytest_django.fixtures import Settings as SettingsWrapper
from rest_framework.test import APIClient

from recovery.choices import AuditKind, Connection, RecommendationStatus
from recovery.controller.client import AdvisorClient
from recovery.controller.controller import AdvisorController
from recovery.models import (
    AuditEvent,
    Cluster,
    ControllerToken,
    IngestToken,
    IngestTokenKind,
    LogCursor,
    ProgressSample,
    Recommendation,
    Workload,
)
from recovery.models.controller import hash_token
from tests.controller.test_controller_safety import STARTED, SUBMITTED, ModelSlurm, running_job
from tests.factories import AttemptFactory, ClusterFactory, RecommendationFactory, WorkloadFactory
from tests.security.test_tenant_credentials import (
    HEARTBEATS,
    LOGS,
    assert_refused,
    bearer,
    stored_rows,
    victim_line,
)

# The per-minute counters live in Redis with the throttle counters: tests/conftest.py's
# _own_throttle_counters gives each test its own prefix, so tests (and earlier runs within the
# minute) do not share them.
pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster() -> Cluster:
    return ClusterFactory(name="shared", connection=Connection.SIMULATED)


@pytest.fixture
def tenant_job(cluster: Cluster) -> Workload:
    workload = WorkloadFactory(cluster=cluster, job_id="5001", user="mallory")
    AttemptFactory(workload=workload, number=1, nodes=["gpu-3"])
    return workload


@pytest.fixture
def tenant(tenant_job: Workload) -> APIClient:
    _, key = IngestToken.issue(
        tenant_job.cluster,
        IngestTokenKind.JOB,
        name="job-5001",
        issued_by="olga",
        job_id=tenant_job.job_id,
        job_submit_time=tenant_job.submit_time,
    )
    return bearer(key)


def assert_throttled(response: Any, words: str) -> None:
    assert_refused(response, 429, words)
    wait = int(response.headers["Retry-After"])
    assert 1 <= wait <= 60
    assert response.json()["retry_after"] == wait
    assert response.json()["code"] == "throttled"


# --- streams ------------------------------------------------------------------------------


def test_a_job_token_cannot_create_streams_past_the_cap(
    tenant: APIClient, tenant_job: Workload, settings: SettingsWrapper
) -> None:
    settings.JOB_TOKEN_STREAMS_PER_JOB = 3

    def batch(stream: str, sequence: int | None = 1) -> Any:
        body: dict[str, Any] = {"job_id": tenant_job.job_id, "stream": stream, "lines": ["s"]}
        if sequence is not None:
            body["sequence"] = sequence
        return tenant.post(LOGS, body, format="json")

    for number in range(3):
        assert batch(f"gpu-3:{number}").status_code == 200
    before = stored_rows()
    assert_throttled(batch("gpu-3:3"), "3 streams")
    assert stored_rows() == before
    assert LogCursor.objects.filter(workload=tenant_job).count() == 3
    # Its streams go on, and a batch that names no sequence opens none.
    assert batch("gpu-3:0", sequence=2).status_code == 200
    assert batch("gpu-3:99", sequence=None).status_code == 200
    assert LogCursor.objects.filter(workload=tenant_job).count() == 3


def test_the_stream_cap_has_a_finite_default() -> None:
    from django.conf import settings

    assert 1 <= settings.JOB_TOKEN_STREAMS_PER_JOB <= 10_000


# --- samples per minute -------------------------------------------------------------------


def test_heartbeats_past_the_per_minute_cap_are_refused_and_nothing_of_them_is_stored(
    tenant: APIClient, tenant_job: Workload, settings: SettingsWrapper
) -> None:
    settings.JOB_TOKEN_HEARTBEATS_PER_MINUTE = 1500
    first = [{"job_id": tenant_job.job_id, "step": step, "rank": 0} for step in range(1000)]
    assert tenant.post(HEARTBEATS, first, format="json").json()["samples"] == 1000
    before = stored_rows()
    tenant_job.refresh_from_db()
    progress_before = (tenant_job.last_progress_step, tenant_job.last_checkpoint_step)
    second = [
        {"job_id": tenant_job.job_id, "step": 1000 + step, "checkpoint_step": 1000 + step}
        for step in range(1000)
    ]
    assert_throttled(tenant.post(HEARTBEATS, second, format="json"), "heartbeats per minute")
    assert stored_rows() == before
    assert ProgressSample.objects.filter(workload=tenant_job).count() == 1000
    tenant_job.refresh_from_db()
    assert (tenant_job.last_progress_step, tenant_job.last_checkpoint_step) == progress_before
    # What is left of the minute's budget is still there.
    assert tenant.post(HEARTBEATS, second[:500], format="json").status_code == 200


def test_log_lines_past_the_per_minute_cap_are_refused_and_nothing_of_them_is_stored(
    tenant: APIClient, tenant_job: Workload, settings: SettingsWrapper
) -> None:
    settings.JOB_TOKEN_LOG_LINES_PER_MINUTE = 100
    lines = [
        f" iteration {step}/ 1000 | elapsed time per iteration (ms): 812.4 |" for step in range(100)
    ]
    body = {"job_id": tenant_job.job_id, "stream": "gpu-3:0", "sequence": 1, "lines": lines}
    assert tenant.post(LOGS, body, format="json").status_code == 200
    before = stored_rows()
    cursor_before = LogCursor.objects.get(workload=tenant_job).offset
    crash = {
        "job_id": tenant_job.job_id,
        "stream": "gpu-3:0",
        "sequence": 2,
        "lines": [victim_line(tenant_job.job_id)],
    }
    assert_throttled(tenant.post(LOGS, crash, format="json"), "log lines per minute")
    assert stored_rows() == before
    # The refused batch's sequence was not taken: sent again later, it is not a "repeat".
    assert LogCursor.objects.get(workload=tenant_job).offset == cursor_before


# --- a job id Slurm hands out again -------------------------------------------------------


def test_a_job_token_for_a_job_id_alone_is_not_issued(operator: User, cluster: Cluster) -> None:
    client = APIClient()
    client.force_login(operator)
    url = reverse("api:job-token-issue", args=[cluster.pk])
    response = client.post(url, {"job_id": "5001"}, format="json")
    assert response.status_code == 400, response.content
    assert "submit time" in response.json()["fields"]["non_field_errors"][0]
    with pytest.raises(CommandError, match="submit time"):
        call_command(
            "issue_ingest_token", "--cluster", cluster.name, "--kind", "job", "--job-id", "5001"
        )
    assert not IngestToken.objects.exists()


def test_a_token_for_a_job_id_alone_does_not_cover_a_later_job_that_reuses_the_id(
    cluster: Cluster, tenant_job: Workload
) -> None:
    # A token issued before job tokens had to name the submit time: its job id only.
    raw = "wrj_unbound-token-of-an-earlier-release"
    IngestToken.objects.create(
        cluster=cluster,
        kind=IngestTokenKind.JOB,
        name="job-5001",
        job_id=tenant_job.job_id,
        issued_by="olga",
        key_prefix=raw[:12],
        key_hash=hash_token(raw),
        expires_at=timezone.now() + timedelta(hours=72),
    )
    # Slurm's controller restarted with its state reset: job 5001 is now alice's.
    reused = WorkloadFactory(
        cluster=cluster,
        job_id=tenant_job.job_id,
        user="alice",
        submit_time=tenant_job.submit_time + timedelta(days=3),
    )
    AttemptFactory(workload=reused, number=1, nodes=["gpu-7"])
    before = stored_rows()
    lines = {"job_id": reused.job_id, "lines": [victim_line(reused.job_id)]}
    response = bearer(raw).post(LOGS, lines, format="json")
    assert_refused(response, 403, "without its submit time")
    beat = {"job_id": reused.job_id, "step": 10**9, "checkpoint_step": 10**9}
    assert_refused(bearer(raw).post(HEARTBEATS, beat, format="json"), 403, "submit time")
    assert stored_rows() == before
    reused.refresh_from_db()
    assert reused.last_checkpoint_step is None


# --- two controllers on one token ---------------------------------------------------------


def controller_process(key: str) -> APIClient:
    """One Advisor Controller process: the token it was given, its own instance id."""
    client = APIClient()
    client.credentials(
        HTTP_AUTHORIZATION=f"Bearer {key}", HTTP_X_CONTROLLER_INSTANCE=str(uuid.uuid4())
    )
    return client


def advisor(client: APIClient, what: str, recommendation: Recommendation, **body: Any) -> Any:
    url = reverse(f"api:advisor-{what}", args=[recommendation.pk])
    return client.post(url, body, format="json")


REQUEUE = {"argv": ["scontrol", "requeuehold", "4242"], "sequence": 1}
EXECUTED = {
    "outcome": "executed",
    "state_before": {"job_state": "RUNNING"},
    "commands": [{"argv": ["scontrol", "requeuehold", "4242"], "returncode": 0}],
    "converged": True,
}


def test_a_second_controller_on_the_same_token_cannot_act_on_the_first_ones_lease(
    cluster: Cluster,
) -> None:
    recommendation = RecommendationFactory(
        workload=WorkloadFactory(cluster=cluster), status=RecommendationStatus.READY
    )
    _, key = ControllerToken.issue(cluster, "slurm-advisor-1")
    first, second = controller_process(key), controller_process(key)
    assert advisor(first, "claim", recommendation, lease_seconds=60).status_code == 200
    held = Recommendation.objects.get(pk=recommendation.pk)

    assert advisor(second, "claim", recommendation).status_code == 409
    assert advisor(second, "renew", recommendation, lease_seconds=600).status_code == 409
    assert advisor(second, "dispatch", recommendation, **REQUEUE).status_code == 409
    assert advisor(second, "report", recommendation, **EXECUTED).status_code == 409
    now = Recommendation.objects.get(pk=recommendation.pk)
    assert (now.status, now.lease_expires_at, now.lease_instance) == (
        RecommendationStatus.CLAIMED,
        held.lease_expires_at,
        held.lease_instance,
    )
    assert not AuditEvent.objects.filter(kind=AuditKind.DISPATCHED).exists()
    assert not AuditEvent.objects.filter(kind=AuditKind.SCHEDULER_ACTION).exists()
    refused = AuditEvent.objects.get(kind=AuditKind.REPORT_REFUSED)
    assert refused.actor == "controller:slurm-advisor-1"
    assert refused.payload["controller_instance"] != held.lease_instance

    # The first one is paused past its lease; the second takes over. Back, the first is fenced:
    # it must not run the command the second one is about to run.
    Recommendation.objects.filter(pk=recommendation.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert advisor(second, "claim", recommendation, lease_seconds=60).status_code == 200
    assert advisor(first, "renew", recommendation, lease_seconds=600).status_code == 409
    assert advisor(first, "dispatch", recommendation, **REQUEUE).status_code == 409
    assert advisor(first, "report", recommendation, **EXECUTED).status_code == 409
    assert advisor(second, "dispatch", recommendation, **REQUEUE).status_code == 200
    assert AuditEvent.objects.filter(kind=AuditKind.DISPATCHED).count() == 1


# --- the caps hold under concurrent requests ----------------------------------------------


def push_together(url: str, key: str, bodies: list[Any]) -> list[int]:
    """POST every body at once, each from its own thread and connection; the statuses."""
    statuses: list[int] = []
    start = threading.Barrier(len(bodies))

    def send(body: Any) -> None:
        request = urllib.request.Request(
            url,
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            method="POST",
        )
        start.wait()
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                statuses.append(response.status)
        except urllib.error.HTTPError as exc:
            statuses.append(exc.code)

    threads = [threading.Thread(target=send, args=(body,)) for body in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(statuses)


@pytest.mark.django_db(transaction=True)
def test_concurrent_pushes_do_not_pass_the_caps_together(
    live_server: Any, settings: SettingsWrapper
) -> None:
    settings.JOB_TOKEN_HEARTBEATS_PER_MINUTE = 1000
    settings.JOB_TOKEN_STREAMS_PER_JOB = 4
    cluster = ClusterFactory(name="busy")
    workload = WorkloadFactory(cluster=cluster, job_id="6001", user="mallory")
    AttemptFactory(workload=workload, number=1, nodes=["gpu-3"])
    _, key = IngestToken.issue(
        cluster,
        IngestTokenKind.JOB,
        name="job-6001",
        issued_by="olga",
        job_id="6001",
        job_submit_time=workload.submit_time,
    )
    beats = [[{"job_id": "6001", "step": 100 * n + i} for i in range(100)] for n in range(16)]
    statuses = push_together(live_server.url + HEARTBEATS, key, beats)
    assert statuses == [200] * 10 + [429] * 6
    assert ProgressSample.objects.filter(workload=workload).count() == 1000

    batches = [
        {"job_id": "6001", "stream": f"gpu-3:{n}", "sequence": 1, "lines": ["x"]} for n in range(12)
    ]
    statuses = push_together(live_server.url + LOGS, key, batches)
    assert statuses == [200] * 4 + [429] * 8
    assert LogCursor.objects.filter(workload=workload).count() == 4


@pytest.mark.django_db(transaction=True)
def test_a_controller_back_from_a_pause_runs_nothing_the_other_one_on_its_token_holds(
    live_server: Any,
) -> None:
    """
    GIVEN two controller processes started with one token, on one Slurm, and a ready restart
    WHEN the first is paused right after its requeue, past its lease; the second takes the
         restart over and has set the exclusions when the first comes back
    THEN the first runs no further command (the second's lease is not its lease): each
         scheduler command runs once, and the second finishes the restart
    """
    cluster = ClusterFactory(name="lab")
    workload = WorkloadFactory(cluster=cluster, job_id="4242", user="alice", submit_time=SUBMITTED)
    attempt = AttemptFactory(workload=workload, number=1, started_at=STARTED)
    recommendation = RecommendationFactory(
        workload=workload,
        attempt=attempt,
        status=RecommendationStatus.READY,
        excluded_nodes=["gpu-002"],
    )
    _, key = ControllerToken.issue(cluster, "slurm-advisor-1")
    slurm = ModelSlurm(running_job())
    first = AdvisorController(AdvisorClient(live_server.url, key), slurm, settle_seconds=5)
    second = AdvisorController(AdvisorClient(live_server.url, key), slurm, settle_seconds=5)
    first_paused, first_back, second_paused, second_back = (threading.Event() for _ in range(4))

    def pause(paused: threading.Event, back: threading.Event) -> Callable[[], None]:
        def hook() -> None:
            paused.set()
            assert back.wait(60)

        return hook

    # After a command took effect, its controller stops there until let go.
    slurm.after["requeuehold"] = pause(first_paused, first_back)
    slurm.after["update"] = pause(second_paused, second_back)
    outcomes: dict[str, Any] = {}

    def run(name: str, controller: AdvisorController) -> threading.Thread:
        thread = threading.Thread(target=lambda: outcomes.update({name: controller.run_once()}))
        thread.start()
        return thread

    first_run = run("first", first)
    assert first_paused.wait(60)
    Recommendation.objects.filter(pk=recommendation.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    second_run = run("second", second)
    assert second_paused.wait(60)
    first_back.set()
    first_run.join(60)
    second_back.set()
    second_run.join(60)

    assert outcomes == {
        "first": [(recommendation.pk, "unreported retry")],
        "second": [(recommendation.pk, "executed")],
    }
    assert slurm.commands == ["requeuehold", "update", "release"]
    dispatched = AuditEvent.objects.filter(kind=AuditKind.DISPATCHED).order_by("id")
    assert [event.payload["argv"][1] for event in dispatched] == [
        "requeuehold",
        "update",
        "release",
    ]
    recommendation.refresh_from_db()
    assert recommendation.status == RecommendationStatus.EXECUTED
    assert recommendation.lease_instance == second.api.instance  # type: ignore[attr-defined]
    refused = AuditEvent.objects.get(kind=AuditKind.REPORT_REFUSED)
    assert refused.payload["controller_instance"] == first.api.instance  # type: ignore[attr-defined]
    assert refused.actor == "controller:slurm-advisor-1"
