"""The workflow pages: the list with its filters, and one workflow's jobs on one timeline."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from console.workflow_timeline import attempt_row
from recovery.choices import AttemptExitState
from recovery.models import Policy, Workflow
from tests.conftest import TEST_PASSWORD
from tests.factories import AnomalyFactory, AttemptFactory, ClusterFactory, WorkloadFactory
from tests.fakes import SUBMITTED

pytestmark = pytest.mark.django_db


def logged_in(user: User) -> Client:
    client = Client()
    assert client.login(username=user.username, password=TEST_PASSWORD)
    return client


@pytest.fixture
def workflow() -> Workflow:
    cluster = ClusterFactory(name="lab")
    workflow = Workflow.objects.create(cluster=cluster, user="alice", name="llama-pretrain")
    first = WorkloadFactory(cluster=cluster, job_id="100", workflow=workflow,
                            submit_time=SUBMITTED - timedelta(hours=2))  # fmt: skip
    AttemptFactory(
        workload=first, number=1, nodes=["gpu-001", "gpu-002"],
        started_at=SUBMITTED - timedelta(hours=2), ended_at=SUBMITTED - timedelta(hours=1),
        exit_state=AttemptExitState.FAILED,
    )  # fmt: skip
    AnomalyFactory(workload=first, attempt=first.attempts.get(), implicated_nodes=["gpu-002"],
                   detected_at=SUBMITTED - timedelta(hours=1))  # fmt: skip
    second = WorkloadFactory(cluster=cluster, job_id="101", workflow=workflow,
                             depends_on=["100"], submit_time=SUBMITTED)  # fmt: skip
    AttemptFactory(workload=second, number=1, nodes=["gpu-001", "gpu-003"],
                   excluded_nodes=["gpu-002"], started_at=SUBMITTED)  # fmt: skip
    return workflow


def test_the_list_shows_each_workflow_with_its_jobs(viewer: User, workflow: Workflow) -> None:
    Workflow.objects.create(cluster=ClusterFactory(name="prod"), user="bob", name="sft")
    body = logged_in(viewer).get(reverse("console:workflows")).content.decode()
    assert reverse("console:workflow", args=[workflow.pk]) in body
    assert "llama-pretrain" in body and "sft" in body


@pytest.mark.parametrize(
    ("query", "shown"),
    [
        ({"cluster": "lab"}, ["llama-pretrain"]),
        ({"user": "bob"}, ["sft"]),
        ({"q": "PRETRAIN"}, ["llama-pretrain"]),
        ({"q": "nothing"}, []),
    ],
)
def test_the_list_is_filtered(
    viewer: User, workflow: Workflow, query: dict[str, str], shown: list[str]
) -> None:
    Workflow.objects.create(cluster=ClusterFactory(name="prod"), user="bob", name="sft")
    body = logged_in(viewer).get(reverse("console:workflows"), query).content.decode()
    for name in ("llama-pretrain", "sft"):
        assert (f">{name}</a>" in body) == (name in shown)


def test_the_page_shows_the_jobs_the_budget_and_the_nodes_kept_out(
    viewer: User, workflow: Workflow
) -> None:
    Policy.objects.create(name="lab", max_attempts=4)
    body = logged_in(viewer).get(reverse("console:workflow", args=[workflow.pk])).content.decode()
    for job in workflow.workloads.all():
        assert reverse("console:workload", args=[job.pk]) in body
    assert '2</span> <span class="muted">· budget 4 · 2 left' in body  # across both jobs
    assert "gpu-002" in body
    assert 'id="workflow-timeline-figure"' in body


def test_the_timeline_has_one_row_per_attempt_of_every_job(
    viewer: User, workflow: Workflow
) -> None:
    response = logged_in(viewer).get(reverse("console:workflow_timeline", args=[workflow.pk]))
    figure: dict[str, Any] = response.json()
    rows = figure["layout"]["yaxis"]["categoryarray"]
    assert rows == [attempt_row("100", 1), attempt_row("101", 1)]
    bars = [trace for trace in figure["data"] if trace["type"] == "bar"]
    assert {row for trace in bars for row in trace["y"]} == set(rows)
    [markers] = [trace for trace in figure["data"] if trace["type"] == "scatter"]
    assert markers["y"] == [attempt_row("100", 1)]


def test_the_workload_page_links_its_workflow(viewer: User, workflow: Workflow) -> None:
    job = workflow.workloads.first()
    assert job is not None
    body = logged_in(viewer).get(reverse("console:workload", args=[job.pk])).content.decode()
    assert reverse("console:workflow", args=[workflow.pk]) in body


def test_the_workload_page_says_why_a_workflow_was_not_taken(viewer: User) -> None:
    job = WorkloadFactory(workflow_ignored="workflow 'a b' contains ' '")
    body = logged_in(viewer).get(reverse("console:workload", args=[job.pk])).content.decode()
    assert "none: workflow &#x27;a b&#x27; contains &#x27; &#x27;" in body


@pytest.mark.parametrize("name", ["console:workflows", "console:workflow"])
def test_anonymous_readers_are_sent_to_log_in_and_outsiders_refused(
    name: str, workflow: Workflow, outsider: User
) -> None:
    url = reverse(name, args=[workflow.pk] if name == "console:workflow" else [])
    response = Client().get(url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))
    assert logged_in(outsider).get(url).status_code == 403
