"""The Console page that inspects a cluster's log and metric stores and saves them (admins)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from pytest_django.fixtures import Settings as SettingsWrapper

from recovery.roles import ADMIN
from recovery.sources.logs.base import to_ns
from tests.conftest import TEST_PASSWORD
from tests.factories import ClusterFactory
from tests.sources.recorded_servers import LokiEntry, RecordedServer, loki, serving

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _stores_on_loopback_allowed(settings: SettingsWrapper) -> None:
    settings.CONFIGURATOR_ALLOWED_HOSTS = ["127.0.0.1"]


NCCL_ERROR = (
    "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3763, unhandled "
    "system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.28.8"
)


@pytest.fixture
def loki_server() -> Iterator[RecordedServer]:
    at = to_ns(datetime.now(UTC) - timedelta(minutes=5))
    labels = {"slurm_job_id": "4242", "host": "gpu-002", "rank": "3"}
    with serving(loki([LokiEntry(labels, at, NCCL_ERROR)])) as running:
        yield running


@pytest.fixture
def admin_user(make_user: Callable[..., User]) -> User:
    return make_user("ada", ADMIN, is_staff=True)


@pytest.fixture
def superuser(make_user: Callable[..., User]) -> User:
    return make_user("root", is_staff=True, is_superuser=True)


def logged_in(user: User) -> Client:
    client = Client()
    assert client.login(username=user.username, password=TEST_PASSWORD)
    return client


def test_an_admin_inspects_and_a_superuser_saves_the_log_store(
    admin_user: User, superuser: User, loki_server: RecordedServer
) -> None:
    cluster = ClusterFactory(name="lab")
    url = reverse("console:cluster_signals", args=[cluster.pk])
    client = logged_in(admin_user)

    inspected = client.post(url, {"logs": loki_server.url, "inspect": ""})
    body = inspected.content.decode()
    assert inspected.status_code == 200
    assert "job=slurm_job_id, node=host, rank=rank" in body
    assert "nccl_error" in body
    assert 'name="save"' not in body
    assert "Only a superuser can save the stores" in body
    cluster.refresh_from_db()
    assert "log_source" not in cluster.connection_settings

    saved = logged_in(superuser).post(url, {"logs": loki_server.url, "save": ""})
    assert saved.status_code == 302
    cluster.refresh_from_db()
    assert cluster.connection_settings["log_source"]["mapping"]["job"] == "slurm_job_id"


def test_a_bad_url_is_refused_by_the_form(admin_user: User) -> None:
    cluster = ClusterFactory()
    url = reverse("console:cluster_signals", args=[cluster.pk])
    response = logged_in(admin_user).post(url, {"logs": "not a url", "save": ""})
    assert response.status_code == 200
    assert "Enter a valid URL" in response.content.decode()


def test_an_unreachable_store_saves_nothing(superuser: User) -> None:
    cluster = ClusterFactory()
    url = reverse("console:cluster_signals", args=[cluster.pk])
    response = logged_in(superuser).post(url, {"logs": "http://127.0.0.1:9/", "save": ""})
    assert response.status_code == 200
    assert "Nothing saved" in response.content.decode()
    cluster.refresh_from_db()
    assert "log_source" not in cluster.connection_settings


@pytest.mark.parametrize("role_fixture", ["viewer", "operator"])
def test_only_admins_may_configure_stores(
    role_fixture: str, request: pytest.FixtureRequest
) -> None:
    user = request.getfixturevalue(role_fixture)
    cluster = ClusterFactory()
    response = logged_in(user).get(reverse("console:cluster_signals", args=[cluster.pk]))
    assert response.status_code == 403
