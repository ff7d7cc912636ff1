"""The caps on what one job token pushes for one job: what counts, what is given back, and what
happens when the counts cannot be read."""

from __future__ import annotations

from typing import Any

import pytest
from pytest_django.fixtures import Settings as SettingsWrapper
from rest_framework.test import APIClient

from recovery.models import (
    Cluster,
    IngestToken,
    IngestTokenKind,
    LogCursor,
    ProgressSample,
    Workload,
)
from tests.factories import AttemptFactory, ClusterFactory, WorkloadFactory
from tests.security.test_tenant_credentials import HEARTBEATS, LOGS, bearer, stored_rows

# The per-minute counts live in Redis with the throttle counters, under the per-test prefix of
# tests/conftest.py's _own_throttle_counters.
pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster() -> Cluster:
    return ClusterFactory(name="lab")


def job(cluster: Cluster, job_id: str) -> Workload:
    workload = WorkloadFactory(cluster=cluster, job_id=job_id, user="alice")
    AttemptFactory(workload=workload, number=1, nodes=["gpu-1"])
    return workload


def user_token(cluster: Cluster) -> APIClient:
    _, key = IngestToken.issue(
        cluster, IngestTokenKind.JOB, name="user-alice", issued_by="olga", user="alice"
    )
    return bearer(key)


def beats(workload: Workload, count: int, first: int = 0) -> list[dict[str, Any]]:
    return [{"job_id": workload.job_id, "step": first + step} for step in range(count)]


def test_one_request_larger_than_a_minutes_cap_is_too_large_not_throttled(
    cluster: Cluster, settings: SettingsWrapper
) -> None:
    settings.JOB_TOKEN_LOG_LINES_PER_MINUTE = 10
    workload = job(cluster, "101")
    before = stored_rows()
    body = {"job_id": "101", "lines": ["x"] * 11}
    response = user_token(cluster).post(LOGS, body, format="json")
    assert response.status_code == 413
    assert "at most 10 log lines per minute" in response.json()["error"]
    assert "Retry-After" not in response.headers
    assert stored_rows() == before
    assert workload.last_progress_step is None


def test_a_request_for_two_jobs_is_refused_whole_and_what_was_counted_is_given_back(
    cluster: Cluster, settings: SettingsWrapper
) -> None:
    settings.JOB_TOKEN_HEARTBEATS_PER_MINUTE = 100
    first, second = job(cluster, "201"), job(cluster, "202")
    client = user_token(cluster)
    assert client.post(HEARTBEATS, beats(second, 90), format="json").status_code == 200
    before = stored_rows()
    both = beats(first, 50) + beats(second, 20, first=1000)
    assert client.post(HEARTBEATS, both, format="json").status_code == 429
    assert stored_rows() == before
    assert not ProgressSample.objects.filter(workload=first).exists()
    # The first job's 50 were given back: its whole minute is still there.
    assert client.post(HEARTBEATS, beats(first, 100), format="json").status_code == 200


def test_each_job_and_each_token_has_its_own_minute(
    cluster: Cluster, settings: SettingsWrapper
) -> None:
    settings.JOB_TOKEN_HEARTBEATS_PER_MINUTE = 50
    first, second = job(cluster, "301"), job(cluster, "302")
    client = user_token(cluster)
    assert client.post(HEARTBEATS, beats(first, 50), format="json").status_code == 200
    assert client.post(HEARTBEATS, beats(first, 1, 50), format="json").status_code == 429
    assert client.post(HEARTBEATS, beats(second, 50), format="json").status_code == 200
    _, key = IngestToken.issue(
        cluster,
        IngestTokenKind.JOB,
        name="job-301",
        issued_by="olga",
        job_id="301",
        job_submit_time=first.submit_time,
    )
    assert bearer(key).post(HEARTBEATS, beats(first, 50, 100), format="json").status_code == 200


def test_the_stream_cap_is_the_jobs_whichever_token_opens_them(
    cluster: Cluster, settings: SettingsWrapper
) -> None:
    settings.JOB_TOKEN_STREAMS_PER_JOB = 2
    workload = job(cluster, "401")
    _, key = IngestToken.issue(
        cluster,
        IngestTokenKind.JOB,
        name="job-401",
        issued_by="olga",
        job_id="401",
        job_submit_time=workload.submit_time,
    )
    by_user, by_job = user_token(cluster), bearer(key)

    def batch(client: APIClient, stream: str) -> Any:
        body = {"job_id": "401", "stream": stream, "sequence": 1, "lines": ["x"]}
        return client.post(LOGS, body, format="json")

    assert batch(by_user, "a").status_code == 200
    assert batch(by_job, "b").status_code == 200
    refused = batch(by_job, "c")
    assert refused.status_code == 429
    assert "2 streams of pushed batches" in refused.json()["error"]
    assert LogCursor.objects.filter(workload=workload).count() == 2
    # Another job has streams of its own.
    assert batch(by_user, "a").json()["duplicate"] is True
    other = job(cluster, "402")
    body = {"job_id": "402", "stream": "c", "sequence": 1, "lines": ["x"]}
    assert by_user.post(LOGS, body, format="json").status_code == 200
    assert LogCursor.objects.filter(workload=other).count() == 1


def test_a_repeated_batch_spends_nothing(cluster: Cluster, settings: SettingsWrapper) -> None:
    settings.JOB_TOKEN_LOG_LINES_PER_MINUTE = 10
    job(cluster, "501")
    client = user_token(cluster)
    body = {"job_id": "501", "stream": "s", "sequence": 1, "lines": ["x"] * 10}
    assert client.post(LOGS, body, format="json").json()["duplicate"] is False
    for _ in range(3):
        assert client.post(LOGS, body, format="json").json()["duplicate"] is True


def test_when_the_counts_cannot_be_read_nothing_is_stored(
    cluster: Cluster, settings: SettingsWrapper
) -> None:
    workload = job(cluster, "601")
    client = user_token(cluster)
    settings.CACHES = {
        **settings.CACHES,
        "throttle": {**settings.CACHES["throttle"], "LOCATION": "redis://127.0.0.1:1/0"},
    }
    before = stored_rows()
    for url, body in (
        (HEARTBEATS, beats(workload, 5)),
        (LOGS, {"job_id": "601", "stream": "s", "sequence": 1, "lines": ["x"]}),
    ):
        response = client.post(url, body, format="json")
        assert response.status_code == 503, response.content
        assert response.json()["code"] == "unavailable"
        assert "nothing was stored" in response.json()["error"]
        assert response.headers["Retry-After"] == "5"
    assert stored_rows() == before
