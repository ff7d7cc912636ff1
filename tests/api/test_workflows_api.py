"""The workflow resource: its jobs, the budget used and left, and the nodes it keeps out."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from pytest_django.fixtures import Settings as SettingsWrapper
from rest_framework.test import APIClient

from recovery.models import Policy, Workflow
from tests.factories import AnomalyFactory, AttemptFactory, ClusterFactory, WorkloadFactory
from tests.fakes import SUBMITTED

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _own_throttle_counters(settings: SettingsWrapper) -> None:
    settings.CACHES = {
        **settings.CACHES,
        "throttle": {**settings.CACHES["throttle"], "KEY_PREFIX": f"test-{uuid.uuid4().hex}"},
    }


def as_user(user: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def two_job_workflow() -> Workflow:
    cluster = ClusterFactory(name="lab")
    workflow = Workflow.objects.create(cluster=cluster, user="alice", name="pretrain")
    first = WorkloadFactory(cluster=cluster, job_id="100", workflow=workflow,
                            submit_time=SUBMITTED)  # fmt: skip
    AttemptFactory(workload=first, number=1, nodes=["gpu-001", "gpu-002"])
    AttemptFactory(workload=first, number=2, excluded_nodes=["gpu-002"], produced_checkpoint=True)
    AnomalyFactory(workload=first, implicated_nodes=["gpu-002"])
    second = WorkloadFactory(
        cluster=cluster, job_id="101", workflow=workflow, depends_on=["100"],
        submit_time=SUBMITTED + timedelta(minutes=5),
    )  # fmt: skip
    AttemptFactory(workload=second, number=1)
    return workflow


def test_a_viewer_lists_workflows_with_their_number_of_jobs(viewer: User) -> None:
    workflow = two_job_workflow()
    response = as_user(viewer).get("/api/v1/workflows/")
    assert response.status_code == 200
    [listed] = response.json()["results"]
    assert listed["id"] == workflow.pk
    assert (listed["cluster_name"], listed["user"], listed["name"]) == ("lab", "alice", "pretrain")
    assert listed["jobs_count"] == 2


def test_workflows_are_filtered_by_cluster_user_and_name(viewer: User) -> None:
    two_job_workflow()
    client = as_user(viewer)
    assert len(client.get("/api/v1/workflows/?user=alice").json()["results"]) == 1
    assert client.get("/api/v1/workflows/?user=bob").json()["results"] == []
    assert client.get("/api/v1/workflows/?cluster=other").json()["results"] == []
    assert len(client.get("/api/v1/workflows/?name=pretrain").json()["results"]) == 1
    assert client.get(f"/api/v1/workflows/?name={'x' * 129}").status_code == 400


def test_a_workflow_shows_its_jobs_budget_and_the_nodes_it_keeps_out(viewer: User) -> None:
    workflow = two_job_workflow()
    Policy.objects.create(name="lab", max_attempts=5, max_attempts_without_checkpoint=3)
    body = as_user(viewer).get(f"/api/v1/workflows/{workflow.pk}/").json()
    assert [job["job_id"] for job in body["jobs"]] == ["101", "100"]
    assert body["jobs"][0]["depends_on"] == ["100"]
    assert body["budget"] == {
        "policy": "lab",
        "attempts": 3,
        "max_attempts": 5,
        "attempts_left": 2,
        "attempts_without_checkpoint": 1,
        "max_attempts_without_checkpoint": 3,
        "attempts_without_checkpoint_left": 2,
        "excluded_nodes": ["gpu-002"],
    }


def test_workloads_name_their_workflow_and_are_filtered_by_it(viewer: User) -> None:
    workflow = two_job_workflow()
    WorkloadFactory()  # in no workflow
    client = as_user(viewer)
    listed = client.get(f"/api/v1/workloads/?workflow={workflow.pk}").json()["results"]
    assert {w["job_id"] for w in listed} == {"100", "101"}
    assert {w["workflow_name"] for w in listed} == {"pretrain"}
    alone = client.get("/api/v1/workloads/?user=alice").json()["results"]
    assert any(w["workflow"] is None and w["workflow_name"] is None for w in alone)


def test_an_outsider_reads_no_workflow(outsider: User) -> None:
    workflow = two_job_workflow()
    client = as_user(outsider)
    assert client.get("/api/v1/workflows/").status_code == 403
    assert client.get(f"/api/v1/workflows/{workflow.pk}/").status_code == 403
    assert APIClient().get("/api/v1/workflows/").status_code == 401
