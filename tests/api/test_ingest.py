"""The ingestion endpoints: heartbeats and log batches take job tokens, hooks take hook tokens."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone
from pytest_django.fixtures import Settings as SettingsWrapper
from rest_framework.test import APIClient

from recovery.choices import AuditKind, Connection, FailureCategory
from recovery.loop import push as pushed
from recovery.loop import scheduler_hooks
from recovery.models import (
    Anomaly,
    AuditEvent,
    Cluster,
    IngestToken,
    IngestTokenKind,
    LogCursor,
    Node,
    ProgressSample,
    Workload,
)
from tests.factories import AttemptFactory, ClusterFactory, WorkloadFactory

pytestmark = pytest.mark.django_db

HEARTBEATS = reverse("api:ingest-heartbeats")
LOGS = reverse("api:ingest-logs")
JOB_ENDED = reverse("api:ingest-job-ended")
NODE_DOWN = reverse("api:ingest-node-down")
OOM_LINE = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.15 GiB of which 1.06 GiB is free."
)


def bearer_client(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def job_client(cluster: Cluster, user: str = "alice") -> APIClient:
    """A job token for the jobs of ``user`` (the factories' jobs belong to alice)."""
    _, key = IngestToken.issue(
        cluster, IngestTokenKind.JOB, name=f"user-{user}", issued_by="test", user=user
    )
    return bearer_client(key)


def hook_token_client(cluster: Cluster) -> APIClient:
    _, key = IngestToken.issue(cluster, IngestTokenKind.HOOK, name="hooks", issued_by="test")
    return bearer_client(key)


@pytest.fixture
def cluster() -> Cluster:
    # A Slurm cluster reached locally: hooks about it ask for a poll.
    return ClusterFactory(name="lab", connection=Connection.LOCAL)


@pytest.fixture
def workload(cluster: Cluster) -> Workload:
    workload = WorkloadFactory(cluster=cluster, job_id="4242")
    AttemptFactory(workload=workload, number=1, nodes=["node001", "node002"])
    return workload


@pytest.fixture
def client(cluster: Cluster) -> APIClient:
    return job_client(cluster)


@pytest.fixture
def hook_client(cluster: Cluster) -> APIClient:
    return hook_token_client(cluster)


@pytest.fixture
def poll_queue(settings: SettingsWrapper) -> Iterator[Callable[[], list[tuple[str, int]]]]:
    """A Celery queue of this test's own in the real Redis broker; lists (task, args) queued."""
    queue = f"wr-test-ingest-{uuid.uuid4().hex[:8]}"
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


# --- authentication ------------------------------------------------------------------------


@pytest.mark.parametrize("url", [HEARTBEATS, LOGS, JOB_ENDED, NODE_DOWN])
def test_it_refuses_callers_without_a_token(url: str) -> None:
    response = APIClient().post(url, {}, format="json")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize("url", [HEARTBEATS, LOGS, JOB_ENDED, NODE_DOWN])
def test_it_refuses_a_revoked_or_expired_token(cluster: Cluster, url: str) -> None:
    kind = IngestTokenKind.HOOK if url in (JOB_ENDED, NODE_DOWN) else IngestTokenKind.JOB
    user = "" if kind == IngestTokenKind.HOOK else "alice"
    revoked, revoked_key = IngestToken.issue(cluster, kind, name="old", issued_by="t", user=user)
    revoked.revoked_at = timezone.now()
    revoked.save()
    _, expired_key = IngestToken.issue(
        cluster,
        kind,
        name="expired",
        issued_by="t",
        user=user,
        expires_at=timezone.now() - timedelta(seconds=1),
    )
    for key in (revoked_key, expired_key):
        response = bearer_client(key).post(url, {}, format="json")
        assert response.status_code == 401
        assert response.json()["error"] == "Unknown, expired or revoked job or hook token."


@pytest.mark.parametrize("url", [HEARTBEATS, LOGS, JOB_ENDED, NODE_DOWN])
def test_it_refuses_a_logged_in_person(url: str, make_user: Callable[..., User]) -> None:
    client = APIClient()
    client.force_login(make_user("olga", "operator"))
    assert client.post(url, {}, format="json").status_code in (401, 403)


def test_a_token_sees_only_the_jobs_of_its_own_cluster(workload: Workload) -> None:
    other = job_client(ClusterFactory(name="other"))
    response = other.post(HEARTBEATS, {"job_id": workload.job_id, "step": 10}, format="json")
    assert response.status_code == 404
    assert "not known on cluster 'other'" in response.json()["error"]
    workload.refresh_from_db()
    assert workload.last_progress_step is None


def test_it_refuses_a_cluster_name_other_than_the_tokens(
    client: APIClient, workload: Workload
) -> None:
    body = {"cluster": "other", "job_id": workload.job_id, "step": 10}
    response = client.post(HEARTBEATS, body, format="json")
    assert response.status_code == 400
    assert "belongs to cluster 'lab'" in response.json()["fields"]["cluster"][0]


# --- heartbeats ----------------------------------------------------------------------------


def test_a_heartbeat_moves_progress_and_records_a_checkpoint_once(
    client: APIClient, workload: Workload
) -> None:
    """
    GIVEN a running job on its first attempt
    WHEN it pushes a heartbeat with a checkpoint, and the same heartbeat again (a retry)
    THEN progress and the checkpoint are on the workload, one checkpoint_saved event is written,
         and the progress sample carries the rank and node
    """
    body = {"job_id": "4242", "step": 120, "checkpoint_step": 100, "rank": 3, "node": "node002"}
    first = client.post(HEARTBEATS, body, format="json")
    assert first.status_code == 200, first.json()
    assert first.json() == {"status": "recorded", "heartbeats": 1, "samples": 1, "checkpoints": 1}
    second = client.post(HEARTBEATS, body, format="json")
    assert second.json()["checkpoints"] == 0

    workload.refresh_from_db()
    assert workload.last_progress_step == 120
    assert workload.last_checkpoint_step == 100
    events = AuditEvent.objects.filter(workload=workload, kind=AuditKind.CHECKPOINT_SAVED)
    assert [e.payload["step"] for e in events] == [100]
    sample = ProgressSample.objects.filter(workload=workload).first()
    assert sample is not None and (sample.rank, sample.node, sample.step) == (3, "node002", 120)


def test_a_batch_of_heartbeats_keeps_the_latest_step(client: APIClient, workload: Workload) -> None:
    now = timezone.now()
    batch = [
        {"job_id": "4242", "step": 12, "at": (now - timedelta(seconds=1)).isoformat()},
        {"job_id": "4242", "step": 11, "at": (now - timedelta(seconds=2)).isoformat()},
    ]
    response = client.post(HEARTBEATS, batch, format="json")
    assert response.status_code == 200
    assert response.json()["heartbeats"] == 2
    workload.refresh_from_db()
    assert workload.last_progress_step == 12


def test_the_first_heartbeat_after_a_restart_records_progress_resumed(
    client: APIClient, workload: Workload
) -> None:
    AttemptFactory(workload=workload, number=2, nodes=["node003"])
    Workload.objects.filter(pk=workload.pk).update(current_attempt=2)
    client.post(HEARTBEATS, {"job_id": "4242", "step": 101}, format="json")
    client.post(HEARTBEATS, {"job_id": "4242", "step": 102}, format="json")
    resumed = AuditEvent.objects.filter(workload=workload, kind=AuditKind.PROGRESS_RESUMED)
    assert [(e.attempt, e.payload["step"]) for e in resumed] == [(2, 101)]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"step": 1}, "job_id"),
        ({"job_id": "4242"}, "step"),
        ({"job_id": "4242", "step": -1}, "step"),
        ({"job_id": "4242", "step": "many"}, "step"),
        ({"job_id": "4242; rm -rf /", "step": 1}, "job_id"),
        ({"job_id": "4242", "step": 1, "node": "../etc"}, "node"),
        ({"job_id": "4242", "step": 1, "throughput": -3}, "throughput"),
        ({"job_id": "4242", "step": 1, "at": "2999-01-01T00:00:00Z"}, "at"),
    ],
)
def test_an_invalid_heartbeat_lists_the_field(
    client: APIClient, workload: Workload, body: dict[str, Any], field: str
) -> None:
    response = client.post(HEARTBEATS, body, format="json")
    assert response.status_code == 400
    assert field in response.json()["fields"]


def test_malformed_json_and_a_wrong_type_are_400(client: APIClient) -> None:
    assert client.post(HEARTBEATS, "{", content_type="application/json").status_code == 400
    assert client.post(HEARTBEATS, "7", content_type="application/json").status_code == 400
    assert client.post(HEARTBEATS, [], format="json").status_code == 400


def test_too_many_heartbeats_are_413(client: APIClient, workload: Workload) -> None:
    batch = [{"job_id": "4242", "step": n} for n in range(pushed.MAX_HEARTBEATS + 1)]
    response = client.post(HEARTBEATS, batch, format="json")
    assert response.status_code == 413
    assert "at most" in response.json()["error"]


def test_heartbeats_of_a_job_not_opted_in_are_ignored(client: APIClient, cluster: Cluster) -> None:
    WorkloadFactory(cluster=cluster, job_id="77", opted_in=False)
    response = client.post(HEARTBEATS, {"job_id": "77", "step": 5}, format="json")
    assert response.status_code == 202
    assert response.json()["status"] == "ignored"
    assert not ProgressSample.objects.exists()


# --- log batches ---------------------------------------------------------------------------


def test_a_log_batch_goes_through_the_detectors(client: APIClient, workload: Workload) -> None:
    """
    GIVEN a running job
    WHEN it pushes a batch with progress, a saved checkpoint and a CUDA out-of-memory error
    THEN a gpu_oom anomaly is recorded with a detected event, on the sender's node and rank,
         and the progress and checkpoint are on the workload
    """
    body = {
        "job_id": "4242",
        "node": "node002",
        "rank": 5,
        "lines": [
            " iteration       30/     100 | consumed samples:         7680 | elapsed time per "
            "iteration (ms): 501.2 | learning rate: 1.500E-04 | global batch size:   256 |",
            "  successfully saved checkpoint from iteration       30 to /ckpt",
            OOM_LINE,
        ],
    }
    response = client.post(LOGS, body, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["anomalies_new"] == 1
    anomaly = Anomaly.objects.get(workload=workload)
    assert anomaly.category == FailureCategory.GPU_OOM
    assert "node002" in anomaly.implicated_nodes
    assert AuditEvent.objects.filter(workload=workload, kind=AuditKind.DETECTED).count() == 1
    workload.refresh_from_db()
    assert workload.last_progress_step == 30
    assert workload.last_checkpoint_step == 30


def test_a_retried_batch_is_not_ingested_twice(client: APIClient, workload: Workload) -> None:
    body = {"job_id": "4242", "stream": "node001:0:r0", "sequence": 1, "lines": [OOM_LINE]}
    first = client.post(LOGS, body, format="json")
    again = client.post(LOGS, body, format="json")
    assert first.json()["status"] == "ingested"
    assert again.status_code == 200
    assert again.json()["status"] == "duplicate"
    assert Anomaly.objects.get(workload=workload).occurrences == 1
    cursor = LogCursor.objects.get(workload=workload)
    assert (cursor.path, cursor.offset) == ("push:node001:0:r0", 1)
    later = client.post(LOGS, {**body, "sequence": 2}, format="json")
    assert later.json()["status"] == "ingested"
    assert Anomaly.objects.get(workload=workload).occurrences == 2


def test_a_text_body_with_bytes_that_are_not_utf8_is_read_with_replacements(
    client: APIClient, workload: Workload
) -> None:
    raw = b"garbage \xff\xfe\x00 here\n" + OOM_LINE.encode() + b"\n"
    response = client.post(
        f"{LOGS}?job_id=4242&node=node001&sequence=3",
        raw,
        content_type="application/octet-stream",
    )
    assert response.status_code == 200, response.json()
    assert response.json()["lines"] == 2
    assert Anomaly.objects.get(workload=workload).category == FailureCategory.GPU_OOM


def test_a_lone_surrogate_and_a_huge_line_are_stored_safely(
    client: APIClient, workload: Workload
) -> None:
    huge = "x" * (pushed.MAX_LINE_CHARS * 3) + " " + OOM_LINE
    body = '{"job_id": "4242", "lines": ["bad \\ud800 surrogate", ' + json.dumps(huge) + "]}"
    response = client.post(LOGS, body, content_type="application/json")
    assert response.status_code == 200, response.json()
    assert response.json()["truncated_lines"] == 1


def test_too_many_lines_or_bytes_are_413(client: APIClient, workload: Workload) -> None:
    lines = ["ok"] * (pushed.MAX_LOG_LINES + 1)
    response = client.post(LOGS, {"job_id": "4242", "lines": lines}, format="json")
    assert response.status_code == 413
    assert response.json()["code"] == "too_large"
    big = "y" * (pushed.MAX_LOG_BYTES + 10)
    response = client.post(LOGS, {"job_id": "4242", "text": big}, format="json")
    assert response.status_code == 413
    assert not Anomaly.objects.exists()


@pytest.mark.parametrize(
    "body",
    [
        {"job_id": "4242"},
        {"job_id": "4242", "lines": ["a"], "text": "a"},
        {"job_id": "4242", "lines": "not a list"},
        {"job_id": "4242", "lines": [{"nested": 1}]},
        {"job_id": "4242", "lines": ["a"], "sequence": 0},
        {"job_id": "4242", "lines": ["a"], "stream": "has space"},
    ],
)
def test_an_invalid_log_batch_is_400(
    client: APIClient, workload: Workload, body: dict[str, Any]
) -> None:
    response = client.post(LOGS, body, format="json")
    assert response.status_code == 400
    assert response.json()["fields"]


def test_logs_of_an_unknown_job_are_404(client: APIClient) -> None:
    response = client.post(LOGS, {"job_id": "999", "lines": [OOM_LINE]}, format="json")
    assert response.status_code == 404
    assert "999" in response.json()["error"]


# --- scheduler hooks -----------------------------------------------------------------------


def test_a_job_end_is_recorded_once_and_asks_for_a_poll(
    hook_client: APIClient,
    workload: Workload,
    poll_queue: Callable[[], list[tuple[str, int]]],
    django_capture_on_commit_callbacks: Any,
) -> None:
    """
    GIVEN an opted-in job known on the cluster
    WHEN EpilogSlurmctld reports that it failed, twice
    THEN one record of what was pushed is in the audit trail, and a poll of the cluster is queued
    """
    body = {
        "job_id": "4242",
        "state": "failed",
        "exit_code": 768,
        "exit_code_text": "3:0",
        "nodes": "node[001-002]",
        "restart_count": 0,
    }
    with django_capture_on_commit_callbacks(execute=True):
        first = hook_client.post(JOB_ENDED, body, format="json")
    assert first.status_code == 200, first.json()
    assert first.json()["status"] == "recorded"
    assert first.json()["poll_requested"] is True
    second = hook_client.post(JOB_ENDED, body, format="json")
    assert second.json()["status"] == "duplicate"

    events = AuditEvent.objects.filter(workload=workload, kind=scheduler_hooks.HOOK_EVENT_KIND)
    assert events.count() == 1
    payload = events.get().payload
    assert payload["event"] == "job_ended"
    assert payload["state"] == "FAILED"
    assert payload["nodes"] == ["node001", "node002"]
    assert events.get().actor == "hook:hooks"
    assert poll_queue() == [("tasks.polling.poll_cluster", workload.cluster_id)]


def test_hooks_in_a_burst_queue_one_poll(
    hook_client: APIClient,
    cluster: Cluster,
    poll_queue: Callable[[], list[tuple[str, int]]],
    django_capture_on_commit_callbacks: Any,
) -> None:
    for job in range(5):
        WorkloadFactory(cluster=cluster, job_id=str(500 + job))
        with django_capture_on_commit_callbacks(execute=True):
            hook_client.post(
                JOB_ENDED, {"job_id": str(500 + job), "state": "FAILED"}, format="json"
            )
    assert len(poll_queue()) == 1


def test_a_job_end_of_an_unknown_job_is_ignored_but_polled(
    hook_client: APIClient,
    cluster: Cluster,
    poll_queue: Callable[[], list[tuple[str, int]]],
    django_capture_on_commit_callbacks: Any,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        response = hook_client.post(JOB_ENDED, {"job_id": "31337", "state": "OOM"}, format="json")
    assert response.status_code == 202
    assert response.json()["status"] == "ignored"
    assert "not known" in response.json()["reason"]
    assert not AuditEvent.objects.exists()
    assert len(poll_queue()) == 1


def test_a_job_end_of_a_job_not_opted_in_is_ignored(
    hook_client: APIClient, cluster: Cluster
) -> None:
    WorkloadFactory(cluster=cluster, job_id="88", opted_in=False)
    response = hook_client.post(JOB_ENDED, {"job_id": "88", "state": "FAILED"}, format="json")
    assert response.status_code == 202
    assert response.json()["poll_requested"] is False
    assert not AuditEvent.objects.exists()


def test_a_simulated_cluster_is_not_polled(django_capture_on_commit_callbacks: Any) -> None:
    cluster = ClusterFactory(connection=Connection.SIMULATED)
    WorkloadFactory(cluster=cluster, job_id="4242")
    with django_capture_on_commit_callbacks(execute=True):
        response = hook_token_client(cluster).post(JOB_ENDED, {"job_id": "4242"}, format="json")
    assert response.status_code == 200
    assert response.json()["poll_requested"] is False


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"state": "FAILED"}, "job_id"),
        ({"job_id": "4242", "state": "FAIL ED"}, "state"),
        ({"job_id": "4242", "exit_code": "x"}, "exit_code"),
        # Only a JSON integer is an integer: a fuzzer found 300.0 taken as 300.
        ({"job_id": "4242", "exit_code": 300.0}, "exit_code"),
        ({"job_id": "4242", "exit_code": "768"}, "exit_code"),
        ({"job_id": "4242", "exit_code": True}, "exit_code"),
        ({"job_id": "4242", "restart_count": 1.0}, "restart_count"),
        ({"job_id": "4242", "exit_code_text": "3"}, "exit_code_text"),
        ({"job_id": "4242", "nodes": "node[001-"}, "nodes"),
        ({"job_id": "4242", "nodes": 7}, "nodes"),
        ({"job_id": "4242", "restart_count": -1}, "restart_count"),
    ],
)
def test_an_invalid_job_end_lists_the_field(
    hook_client: APIClient, workload: Workload, body: dict[str, Any], field: str
) -> None:
    response = hook_client.post(JOB_ENDED, body, format="json")
    assert response.status_code == 400
    assert field in response.json()["fields"]


def test_node_down_is_recorded_per_node_and_once(
    hook_client: APIClient,
    cluster: Cluster,
    poll_queue: Callable[[], list[tuple[str, int]]],
    django_capture_on_commit_callbacks: Any,
) -> None:
    """
    GIVEN two known nodes
    WHEN strigger reports node[001-002] and an unknown node down, and then again
    THEN each known node has one record, the unknown one is ignored, and a poll is queued
    """
    Node.objects.create(cluster=cluster, name="node001")
    Node.objects.create(cluster=cluster, name="node002")
    body = {"node": "node[001-002],node009", "state": "DOWN", "reason": "Not responding"}
    with django_capture_on_commit_callbacks(execute=True):
        response = hook_client.post(NODE_DOWN, body, format="json")
    assert response.status_code == 200, response.json()
    statuses = {r["node"]: r["status"] for r in response.json()["results"]}
    assert statuses == {"node001": "recorded", "node002": "recorded", "node009": "ignored"}
    again = hook_client.post(NODE_DOWN, body, format="json")
    assert {r["status"] for r in again.json()["results"]} == {"duplicate", "ignored"}
    events = AuditEvent.objects.filter(cluster=cluster, kind=scheduler_hooks.HOOK_EVENT_KIND)
    assert sorted(e.payload["node"] for e in events) == ["node001", "node002"]
    assert poll_queue() == [("tasks.polling.poll_cluster", cluster.pk)]


def test_an_invalid_node_down_is_400(hook_client: APIClient) -> None:
    assert hook_client.post(NODE_DOWN, {}, format="json").status_code == 400
    assert hook_client.post(NODE_DOWN, {"node": ""}, format="json").status_code == 400
    response = hook_client.post(NODE_DOWN, {"node": "n1", "reason": "r" * 300}, format="json")
    assert "reason" in response.json()["fields"]


def test_a_broker_that_is_away_does_not_fail_a_hook(
    hook_client: APIClient,
    workload: Workload,
    settings: SettingsWrapper,
    django_capture_on_commit_callbacks: Any,
) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    with django_capture_on_commit_callbacks(execute=True):
        response = hook_client.post(JOB_ENDED, {"job_id": "4242", "state": "FAILED"}, format="json")
    assert response.status_code == 200
    assert AuditEvent.objects.filter(kind=scheduler_hooks.HOOK_EVENT_KIND).count() == 1


def test_the_schema_documents_the_ingestion_endpoints_with_examples() -> None:
    response = APIClient().get(
        reverse("api:schema"), HTTP_ACCEPT="application/vnd.oai.openapi+json"
    )
    assert response.status_code == 200
    paths = response.json()["paths"]
    for path in (
        "/api/v1/ingest/heartbeats/",
        "/api/v1/ingest/logs/",
        "/api/v1/ingest/scheduler/job-ended/",
        "/api/v1/ingest/scheduler/node-down/",
    ):
        operation = paths[path]["post"]
        assert "examples" in operation["requestBody"]["content"]["application/json"], path
        assert {"200", "400", "401", "413"} <= set(operation["responses"]), path
    assert settings.REST_FRAMEWORK  # the schema was built with the project's settings
