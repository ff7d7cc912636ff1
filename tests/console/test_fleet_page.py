"""The fleet page: filters by cluster, state, user and anomaly; sorting; bad values ignored."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from recovery.choices import FailureCategory, WorkloadState
from recovery.read.queries import fleet_ordering
from tests.conftest import TEST_PASSWORD
from tests.factories import AnomalyFactory, ClusterFactory, WorkloadFactory

pytestmark = pytest.mark.django_db


def fleet_page(reader: User, **params: str) -> str:
    client = Client()
    assert client.login(username=reader.username, password=TEST_PASSWORD)
    response = client.get(reverse("console:fleet"), params)
    assert response.status_code == 200
    return response.content.decode()


def listed_jobs(body: str) -> list[str]:
    rows = body.split('<tbody id="fleet-rows">', 1)[1].split("</tbody>", 1)[0]
    return re.findall(r'<a href="/workloads/\d+/">([^<]+)</a>', rows)


def test_it_filters_by_user(viewer: User) -> None:
    WorkloadFactory(job_id="101", user="alice")
    WorkloadFactory(job_id="102", user="bob")
    assert listed_jobs(fleet_page(viewer, user="alice")) == ["101"]


def test_it_filters_by_anomaly_category(viewer: User) -> None:
    hardware = WorkloadFactory(job_id="201")
    oom = WorkloadFactory(job_id="202")
    WorkloadFactory(job_id="203")
    AnomalyFactory(workload=hardware, category=FailureCategory.GPU_HARDWARE)
    AnomalyFactory(workload=oom, category=FailureCategory.GPU_OOM)

    assert listed_jobs(fleet_page(viewer, anomaly="gpu_oom")) == ["202"]
    assert sorted(listed_jobs(fleet_page(viewer, anomaly="any"))) == ["201", "202"]
    assert listed_jobs(fleet_page(viewer, anomaly="none")) == ["203"]


def test_it_combines_cluster_and_state(viewer: User) -> None:
    east, west = ClusterFactory(name="east"), ClusterFactory(name="west")
    WorkloadFactory(job_id="301", cluster=east, state=WorkloadState.RUNNING)
    WorkloadFactory(job_id="302", cluster=east, state=WorkloadState.FAILED)
    WorkloadFactory(job_id="303", cluster=west, state=WorkloadState.RUNNING)
    assert listed_jobs(fleet_page(viewer, cluster="east", state="running")) == ["301"]


def test_it_sorts_by_a_column_both_ways(viewer: User) -> None:
    now = timezone.now()
    WorkloadFactory(job_id="401", last_progress_at=now - timedelta(minutes=5))
    WorkloadFactory(job_id="402", last_progress_at=now - timedelta(minutes=1))
    WorkloadFactory(job_id="403", last_progress_at=now - timedelta(minutes=9))

    assert listed_jobs(fleet_page(viewer, sort="-progress")) == ["402", "401", "403"]
    assert listed_jobs(fleet_page(viewer, sort="progress")) == ["403", "401", "402"]


def test_the_sorted_column_says_so_and_links_the_other_direction(viewer: User) -> None:
    WorkloadFactory(job_id="501")
    body = fleet_page(viewer, sort="job")
    header = re.search(r'<th scope="col" aria-sort="ascending">(.*?)</th>', body, re.S)
    assert header is not None
    assert "sort=-job" in header.group(1)


@pytest.mark.parametrize(
    ("param", "value", "reason"),
    [
        ("state", "exploded", "Unknown state"),
        ("anomaly", "cosmic_rays", "Unknown anomaly category"),
        ("sort", "-password", "Cannot sort by"),
    ],
)
def test_unknown_values_are_ignored_with_the_reason(
    viewer: User, param: str, value: str, reason: str
) -> None:
    WorkloadFactory(job_id="601")
    body = fleet_page(viewer, **{param: value})
    assert reason in body
    assert listed_jobs(body) == ["601"]


def test_an_unknown_sort_key_orders_newest_first() -> None:
    assert fleet_ordering("-nonsense") == ["-submit_time", "-id"]
    assert fleet_ordering("-progress") == ["-last_progress_at", "-id"]
