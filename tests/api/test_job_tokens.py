"""Issuing and revoking job and hook tokens: the API for operators, the command for admins."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from recovery.models import Cluster, IngestToken, IngestTokenKind
from tests.factories import ClusterFactory, WorkloadFactory

pytestmark = pytest.mark.django_db


def as_user(user: User) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def issue_url(cluster: Cluster) -> str:
    return reverse("api:job-token-issue", args=[cluster.pk])


def test_an_operator_issues_a_token_for_a_workload(operator: User) -> None:
    workload = WorkloadFactory(job_id="48213")
    before = timezone.now()
    response = as_user(operator).post(
        issue_url(workload.cluster), {"workload": workload.pk}, format="json"
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["key"].startswith("wrj_")
    assert body["scope"] == "job 48213"
    token = IngestToken.objects.get(pk=body["id"])
    assert (token.kind, token.job_id, token.job_submit_time) == (
        IngestTokenKind.JOB,
        "48213",
        workload.submit_time,
    )
    assert token.issued_by == operator.username
    assert token.expires_at is not None
    assert timedelta(hours=71) < token.expires_at - before <= timedelta(hours=72, seconds=5)
    # The key works for that job, and only the hash is stored.
    assert IngestToken.authenticate(body["key"]) == token
    assert body["key"] not in str(IngestToken.objects.values().get(pk=token.pk))


def test_an_operator_issues_a_token_for_a_user_with_a_lifetime(operator: User) -> None:
    cluster = ClusterFactory()
    response = as_user(operator).post(
        issue_url(cluster), {"user": "alice", "ttl_hours": 2}, format="json"
    )
    assert response.status_code == 201
    token = IngestToken.objects.get(pk=response.json()["id"])
    assert token.user == "alice"
    assert token.expires_at is not None
    assert token.expires_at - timezone.now() <= timedelta(hours=2)


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"job_id": "1"},
        {"job_id": "1", "user": "alice"},
        {"user": "alice", "submit_time": "2026-12-01T00:00:00Z"},
        {"job_id": "1;rm -rf /"},
        {"user": "al ice"},
        {"user": "alice", "ttl_hours": 24 * 365},
        {"user": "alice", "ttl_hours": 0},
    ],
)
def test_a_token_names_exactly_one_job_or_one_user(operator: User, body: dict[str, object]) -> None:
    cluster = ClusterFactory()
    response = as_user(operator).post(issue_url(cluster), body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["fields"]
    assert not IngestToken.objects.exists()


def test_a_workload_of_another_cluster_is_not_found(operator: User) -> None:
    workload = WorkloadFactory()
    response = as_user(operator).post(
        issue_url(ClusterFactory()), {"workload": workload.pk}, format="json"
    )
    assert response.status_code == 404
    assert not IngestToken.objects.exists()


def test_a_viewer_and_an_outsider_may_not_issue_or_revoke(
    viewer: User, outsider: User, operator: User
) -> None:
    cluster = ClusterFactory()
    token, _ = IngestToken.issue(
        cluster, IngestTokenKind.JOB, name="t", issued_by="olga", user="alice"
    )
    for person in (viewer, outsider):
        client = as_user(person)
        response = client.post(issue_url(cluster), {"user": "alice"}, format="json")
        assert response.status_code == 403
        assert "operators and admins" in response.json()["error"]
        revoke = client.post(reverse("api:job-token-revoke", args=[token.pk]))
        assert revoke.status_code == 403
    assert IngestToken.objects.count() == 1
    assert IngestToken.objects.get().revoked_at is None
    assert APIClient().post(issue_url(cluster), {"user": "a"}, format="json").status_code in (
        401,
        403,
    )


def test_revoking_is_at_once_and_a_repeat_changes_nothing(operator: User) -> None:
    cluster = ClusterFactory()
    token, key = IngestToken.issue(
        cluster, IngestTokenKind.JOB, name="t", issued_by="olga", user="alice"
    )
    url = reverse("api:job-token-revoke", args=[token.pk])
    first = as_user(operator).post(url)
    assert first.status_code == 200
    assert first.json()["revoked_at"] is not None
    assert IngestToken.authenticate(key) is None
    second = as_user(operator).post(url)
    assert second.json()["revoked_at"] == first.json()["revoked_at"]


def test_hook_tokens_are_not_revoked_through_the_job_token_api(operator: User) -> None:
    token, _ = IngestToken.issue(ClusterFactory(), IngestTokenKind.HOOK, name="h", issued_by="r")
    response = as_user(operator).post(reverse("api:job-token-revoke", args=[token.pk]))
    assert response.status_code == 404


def issue_command(*args: str) -> str:
    out = StringIO()
    call_command("issue_ingest_token", *args, stdout=out)
    return out.getvalue().strip()


def test_the_command_issues_hook_and_job_tokens() -> None:
    cluster = ClusterFactory(name="lab")
    hook_key = issue_command("--cluster", "lab", "--kind", "hook")
    hook = IngestToken.authenticate(hook_key)
    assert hook is not None
    assert (hook.kind, hook.name, hook.expires_at) == ("hook", "scheduler-hooks", None)
    job_key = issue_command(
        "--cluster", "lab", "--kind", "job", "--job-id", "77", "--submit-time", "2026-12-01T08:00"
    )
    job = IngestToken.authenticate(job_key)
    assert job is not None and job.cluster == cluster
    assert job.job_id == "77"
    assert job.job_submit_time is not None and job.job_submit_time.hour == 8
    assert job.expires_at is not None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kind", "job"], "exactly one job"),
        (["--kind", "job", "--job-id", "77"], "submit time too"),
        (["--kind", "hook", "--user", "alice"], "give no job or user"),
        (["--kind", "job", "--user", "alice", "--ttl-hours", "100000"], "--ttl-hours"),
        (["--kind", "job", "--job-id", "1", "--submit-time", "yesterday"], "ISO 8601"),
    ],
)
def test_the_command_refuses_a_token_without_a_clear_scope(
    args: list[str], message: str, make_user: Callable[..., User]
) -> None:
    ClusterFactory(name="lab")
    with pytest.raises(CommandError, match=message):
        issue_command("--cluster", "lab", *args)
    assert not IngestToken.objects.exists()


def test_an_operator_issues_a_token_for_a_job_id_with_its_submit_time(operator: User) -> None:
    cluster = ClusterFactory()
    response = as_user(operator).post(
        issue_url(cluster),
        {"job_id": "48213", "submit_time": "2026-11-29T01:12:09Z"},
        format="json",
    )
    assert response.status_code == 201, response.content
    token = IngestToken.objects.get(pk=response.json()["id"])
    assert token.job_submit_time is not None
    assert token.job_submit_time.isoformat() == "2026-11-29T01:12:09+00:00"


def test_no_code_path_issues_a_job_token_for_a_job_id_alone() -> None:
    with pytest.raises(ValueError, match="submit time too"):
        IngestToken.issue(
            ClusterFactory(), IngestTokenKind.JOB, name="t", issued_by="olga", job_id="48213"
        )
    assert not IngestToken.objects.exists()


def test_a_token_issued_for_a_job_id_alone_covers_no_job_and_says_so() -> None:
    """Such tokens were issued before the submit time was required; they are kept, listed and
    revocable, but cover nothing: not the job they were meant for, not a later one."""
    workload = WorkloadFactory(job_id="48213")
    token = IngestToken.objects.create(
        cluster=workload.cluster,
        kind=IngestTokenKind.JOB,
        name="job-48213",
        job_id="48213",
        issued_by="olga",
        key_prefix="wrj_legacy",
        key_hash="0" * 64,
    )
    assert not token.may_push_for(workload.job_id, workload.submit_time, workload.user)
    assert token.scope == "job 48213 without its submit time (covers no job)"
    assert "no longer accepted" in token.unbound_problem
    bound, _ = IngestToken.issue(
        workload.cluster,
        IngestTokenKind.JOB,
        name="job-48213",
        issued_by="olga",
        job_id="48213",
        job_submit_time=workload.submit_time,
    )
    assert bound.unbound_problem == ""
    assert bound.may_push_for(workload.job_id, workload.submit_time, workload.user)
    assert not bound.may_push_for(
        workload.job_id, workload.submit_time + timedelta(days=2), workload.user
    )
