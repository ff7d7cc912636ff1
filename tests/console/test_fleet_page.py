"""The fleet page: filters by cluster, state, user and anomaly; the attention order and the
other sorts; bad values ignored."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from console.views.fleet import FLEET_PAGE_SIZE
from recovery.choices import FailureCategory, RecommendationStatus, WorkloadState
from recovery.models import Workload
from recovery.read.queries import fleet_ordering
from tests.conftest import TEST_PASSWORD
from tests.factories import (
    AnomalyFactory,
    ClusterFactory,
    RecommendationFactory,
    WorkloadFactory,
)

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


# ---------- the default order: what needs a person first ----------


def active_at(workload: Workload, minutes_ago: int) -> Workload:
    """The workload's latest activity (``updated_at``, which every save moves) was then."""
    Workload.objects.filter(pk=workload.pk).update(
        updated_at=timezone.now() - timedelta(minutes=minutes_ago)
    )
    return workload


def a_fleet_in_every_group() -> dict[str, list[str]]:
    """Two workloads per attention group, the newer activity first; job ids by group."""
    awaiting = [
        RecommendationFactory(workload=WorkloadFactory(job_id="1001")).workload,
        RecommendationFactory(
            workload=WorkloadFactory(job_id="1002", state=WorkloadState.FAILED)
        ).workload,
    ]
    troubled = [
        WorkloadFactory(job_id="2001", state=WorkloadState.FAILED),
        WorkloadFactory(job_id="2002", state=WorkloadState.HELD),
        WorkloadFactory(job_id="2003", state=WorkloadState.REQUEUED),
        WorkloadFactory(job_id="2004", state=WorkloadState.UNKNOWN),
        # Still running, its restart approved and under way.
        RecommendationFactory(
            workload=WorkloadFactory(job_id="2005"), status=RecommendationStatus.CLAIMED
        ).workload,
    ]
    running = [
        WorkloadFactory(job_id="3001", state=WorkloadState.RUNNING),
        WorkloadFactory(job_id="3002", state=WorkloadState.PENDING),
        # A decision already taken and done does not bring a workload up.
        RecommendationFactory(
            workload=WorkloadFactory(job_id="3003"), status=RecommendationStatus.REJECTED
        ).workload,
    ]
    ended = [
        WorkloadFactory(job_id="4001", state=WorkloadState.COMPLETED),
        WorkloadFactory(job_id="4002", state=WorkloadState.CANCELLED),
        WorkloadFactory(job_id="4003", state=WorkloadState.STOPPED),
    ]
    groups = {"awaiting": awaiting, "troubled": troubled, "running": running, "ended": ended}
    for workloads in groups.values():
        for minutes_ago, workload in enumerate(workloads, start=1):
            active_at(workload, minutes_ago)
    return {name: [w.job_id for w in workloads] for name, workloads in groups.items()}


def test_it_lists_those_awaiting_approval_first_then_failing_running_and_ended(
    viewer: User,
) -> None:
    """
    GIVEN workloads awaiting an approval, failing or being recovered, running, and ended,
          created in no particular order
    WHEN a viewer opens the fleet without choosing an order
    THEN the rows come in that order of groups, the latest activity first in each
    """
    groups = a_fleet_in_every_group()
    expected = groups["awaiting"] + groups["troubled"] + groups["running"] + groups["ended"]

    body = fleet_page(viewer)

    assert listed_jobs(body) == expected
    assert listed_jobs(fleet_page(viewer, sort="attention")) == expected
    assert "Needing attention first" in body


def test_the_latest_activity_comes_first_within_a_group(viewer: User) -> None:
    older = active_at(WorkloadFactory(job_id="501", state=WorkloadState.FAILED), 30)
    newer = active_at(WorkloadFactory(job_id="502", state=WorkloadState.FAILED), 2)
    assert listed_jobs(fleet_page(viewer)) == [newer.job_id, older.job_id]


def test_pagination_keeps_the_attention_order(viewer: User) -> None:
    """
    GIVEN more workloads than a page holds: running ones, then ended ones, failing ones and
          ones awaiting approval created last
    WHEN a viewer reads page after page
    THEN the pages together list every workload once, in attention order, the workloads
         awaiting approval leading the first page and the ended ones closing the last
    """
    cluster = ClusterFactory()
    running = [WorkloadFactory(cluster=cluster) for _ in range(FLEET_PAGE_SIZE)]
    ended = [WorkloadFactory(cluster=cluster, state=WorkloadState.COMPLETED) for _ in range(3)]
    failing = [WorkloadFactory(cluster=cluster, state=WorkloadState.FAILED) for _ in range(3)]
    awaiting = [RecommendationFactory(workload__cluster=cluster).workload for _ in range(2)]
    Workload.objects.update(updated_at=timezone.now() - timedelta(hours=1))

    first, second = fleet_page(viewer), fleet_page(viewer, page="2")

    on_first, on_second = listed_jobs(first), listed_jobs(second)
    assert len(on_first) == FLEET_PAGE_SIZE
    # One activity time for all: the newest workload leads its group.
    newest_first = sorted(awaiting + failing + running + ended, key=lambda w: -w.pk)
    expected = [
        w.job_id
        for group in (awaiting, failing, running, ended)
        for w in newest_first
        if w in group
    ]
    assert on_first + on_second == expected
    assert on_second[-3:] == [w.job_id for w in reversed(ended)]


def test_a_chosen_sort_replaces_the_attention_order_and_links_back(viewer: User) -> None:
    RecommendationFactory(workload=WorkloadFactory(job_id="603"))
    WorkloadFactory(job_id="601", state=WorkloadState.COMPLETED)
    WorkloadFactory(job_id="602", state=WorkloadState.FAILED)

    assert listed_jobs(fleet_page(viewer))[0] == "603"
    body = fleet_page(viewer, sort="job")
    assert listed_jobs(body) == ["601", "602", "603"]
    assert "By job, ascending" in body
    back = re.search(r'<a href="([^"]*)">Needing attention first</a>', body)
    assert back is not None and "sort=" not in back.group(1)
    # Filtering keeps the chosen sort.
    assert '<input type="hidden" name="sort" value="job">' in body


def test_no_column_claims_the_attention_order(viewer: User) -> None:
    WorkloadFactory(job_id="701")
    body = fleet_page(viewer)
    assert 'aria-sort="ascending"' not in body and 'aria-sort="descending"' not in body
    assert 'name="sort"' not in body  # the default needs no parameter
    newest = re.search(r'<a href="([^"]*)">Newest first</a>', body)
    assert newest is not None and "sort=-submitted" in newest.group(1)


def test_filters_apply_within_the_attention_order(viewer: User) -> None:
    east = ClusterFactory(name="east")
    WorkloadFactory(job_id="801", cluster=east, user="alice")
    RecommendationFactory(workload=WorkloadFactory(job_id="802", cluster=east, user="alice"))
    RecommendationFactory(workload=WorkloadFactory(job_id="803", user="alice"))
    WorkloadFactory(job_id="804", cluster=east, user="bob", state=WorkloadState.FAILED)

    assert listed_jobs(fleet_page(viewer, cluster="east", user="alice")) == ["802", "801"]
    assert listed_jobs(fleet_page(viewer, cluster="east", state="failed")) == ["804"]


def test_a_row_awaiting_approval_is_marked_and_links_its_clusters_queue(viewer: User) -> None:
    recommendation = RecommendationFactory(
        workload=WorkloadFactory(cluster=ClusterFactory(name="train a100"))
    )
    WorkloadFactory()
    body = fleet_page(viewer)
    rows = body.split('<tbody id="fleet-rows">', 1)[1]
    assert rows.count('class="fleet-row--awaiting"') == 1
    assert f'href="/approvals/?cluster=train%20a100#recommendation-{recommendation.pk}"' in rows
    assert ">Awaiting approval<" in rows


def test_long_texts_are_cut_on_screen_and_whole_on_hover(viewer: User) -> None:
    name = "llama-3-405b-pretrain-stage2-long-context-annealing-with-a-very-long-name"
    WorkloadFactory(name=name, user="a-user-with-a-rather-long-login-name")
    body = fleet_page(viewer)
    assert f'title="{name}"' in body
    assert 'title="a-user-with-a-rather-long-login-name"' in body
    assert "console/fleet.css" in body
