"""Goodput in the Console: a panel on the workload page, ETTR and cluster figures on the fleet."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.core.cache import cache
from django.test import Client
from django.urls import reverse

from console.templatetags.console import duration, percent
from recovery.choices import WorkloadState
from recovery.read.insights import take_goodput_snapshots
from tests.conftest import TEST_PASSWORD
from tests.factories import ClusterFactory, WorkloadFactory
from tests.read.test_goodput import at, failed_once_and_recovered

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    # Cluster figures are cached for a minute; ids repeat between tests.
    cache.clear()
    yield
    cache.clear()


def logged_in(user: User) -> Client:
    client = Client()
    assert client.login(username=user.username, password=TEST_PASSWORD)
    return client


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "—"),
        (2, "2.0 s"),
        (80, "1 min 20 s"),
        (3 * 3600 + 20 * 60, "3 h 20 min"),
        (2 * 86400 + 3600, "2 d 01 h"),
    ],
)
def test_durations_read_naturally(seconds: float | None, text: str) -> None:
    assert duration(seconds) == text


def test_ratios_read_as_percentages() -> None:
    assert percent(0.93) == "93.0 %"
    assert percent(None) == "—"


def test_the_workload_page_shows_its_goodput(viewer: User) -> None:
    workload = failed_once_and_recovered(ClusterFactory())
    body = logged_in(viewer).get(reverse("console:workload", args=[workload.pk])).content.decode()
    assert 'id="workload-goodput"' in body
    assert "93.0 %" in body  # ETTR
    assert "2.0 s" in body  # detection latency
    assert "3.0 s" in body  # action latency
    assert "1 min 20 s" in body  # time to productive training
    assert "50.0 s" in body  # work lost


def test_unknown_figures_show_a_dash(viewer: User) -> None:
    workload = WorkloadFactory(state=WorkloadState.PENDING)
    body = logged_in(viewer).get(reverse("console:workload", args=[workload.pk])).content.decode()
    panel = body[body.index('id="workload-goodput"') : body.index('id="workload-recommendations"')]
    assert panel.count("—") >= 5
    assert "%" not in panel.split("</dl>")[0]


def test_the_fleet_shows_ettr_per_workload_and_a_line_per_cluster(viewer: User) -> None:
    cluster = ClusterFactory(name="lab")
    failed_once_and_recovered(cluster)
    WorkloadFactory(cluster=cluster, state=WorkloadState.PENDING)
    take_goodput_snapshots(at(86_400))
    body = logged_in(viewer).get(reverse("console:fleet")).content.decode()
    assert ">ETTR<" in body
    rows = body[body.index('id="fleet-rows"') :]
    assert "93.0 %" in rows
    summary = body[body.index('id="cluster-goodput"') : body.index('id="fleet-rows"')]
    assert 'cluster-goodput__name">lab<' in summary
    assert "ETTR <strong>93.0 %</strong> over 1 workload" in summary
    assert "detection latency 2.0 s" in summary


def test_the_fleet_summarises_only_the_filtered_cluster(viewer: User) -> None:
    ClusterFactory(name="lab")
    ClusterFactory(name="prod")
    body = logged_in(viewer).get(reverse("console:fleet"), {"cluster": "prod"}).content.decode()
    summary = body[body.index('id="cluster-goodput"') : body.index('id="fleet-rows"')]
    assert 'cluster-goodput__name">prod<' in summary
    assert 'cluster-goodput__name">lab<' not in summary


def test_the_fleet_says_when_a_cluster_has_no_figures_yet(viewer: User) -> None:
    ClusterFactory(name="lab")
    body = logged_in(viewer).get(reverse("console:fleet")).content.decode()
    summary = body[body.index('id="cluster-goodput"') : body.index('id="fleet-rows"')]
    assert "No goodput figures yet" in summary


def test_ages_in_tables_name_one_unit() -> None:
    from datetime import timedelta

    from django.utils import timezone

    from console.templatetags.console import ago

    now = timezone.now()
    assert ago(None) == "—"
    assert ago(now - timedelta(seconds=20)) == "just now"
    assert ago(now - timedelta(hours=4, minutes=16)) == "4\xa0hours ago"
