"""Admin keeps environment bindings to ones that say which jobs they let choose."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.test import Client
from django.urls import reverse

from recovery.models import Cluster, EnvironmentBinding
from tests.conftest import TEST_PASSWORD
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db

SAYS_WHICH_JOBS = "Say which jobs may choose this environment"


@pytest.fixture
def admin_client(site_admin: User) -> Client:
    client = Client()
    assert client.login(username=site_admin.username, password=TEST_PASSWORD)
    return client


@pytest.fixture
def cluster() -> Cluster:
    return ClusterFactory(name="shared")


def add_binding(client: Client, cluster: Cluster, **fields: str) -> Any:
    form = {"cluster": str(cluster.pk), "environment": "scratch", "partition": "", "account": ""}
    form.update(fields)
    return client.post(reverse("admin:recovery_environmentbinding_add"), form)


@pytest.mark.parametrize(
    "fields",
    [{"partition": "scratch"}, {"account": "physics"}, {"partition": "prod", "account": "physics"},
     {"any_job": "on"}],
)  # fmt: skip
def test_it_saves_a_binding_that_names_its_jobs(
    admin_client: Client, cluster: Cluster, fields: dict[str, str]
) -> None:
    response = add_binding(admin_client, cluster, **fields)
    assert response.status_code == 302
    assert EnvironmentBinding.objects.get().environment == "scratch"


@pytest.mark.parametrize(
    "fields",
    [{}, {"any_job": "on", "partition": "prod"}, {"any_job": "on", "account": "physics"}],
)
def test_it_refuses_a_binding_that_does_not_say_which_jobs(
    admin_client: Client, cluster: Cluster, fields: dict[str, str]
) -> None:
    response = add_binding(admin_client, cluster, **fields)
    assert response.status_code == 200
    assert SAYS_WHICH_JOBS in response.content.decode()
    assert not EnvironmentBinding.objects.exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [("environment", "-scratch"), ("partition", "prod,scratch"), ("account", "a b")],
)
def test_it_refuses_a_name_no_job_could_carry(
    admin_client: Client, cluster: Cluster, field: str, value: str
) -> None:
    fields = {"partition": "prod", field: value}
    response = add_binding(admin_client, cluster, **fields)
    assert response.status_code == 200
    assert "This name " in response.content.decode()
    assert not EnvironmentBinding.objects.exists()


def test_it_refuses_the_same_binding_twice(admin_client: Client, cluster: Cluster) -> None:
    assert add_binding(admin_client, cluster, partition="prod").status_code == 302
    response = add_binding(admin_client, cluster, partition="prod")
    assert response.status_code == 200
    assert "already binds this environment" in response.content.decode()
    assert EnvironmentBinding.objects.count() == 1


def test_the_database_refuses_a_binding_that_names_no_jobs(cluster: Cluster) -> None:
    """Written around the admin form, an empty binding still never reads as "any job"."""
    with pytest.raises(IntegrityError), transaction.atomic():
        EnvironmentBinding.objects.create(cluster=cluster, environment="scratch")
    assert not EnvironmentBinding(cluster=cluster, environment="scratch").covers("prod", "")


def test_viewers_see_bindings_and_only_admins_change_them(viewer: User, site_admin: User) -> None:
    assert viewer.has_perm("recovery.view_environmentbinding")
    assert not viewer.has_perm("recovery.add_environmentbinding")
    assert site_admin.has_perm("recovery.change_environmentbinding")
