"""The policy form's "Preview on the last N days": the edited policy replayed, nothing saved."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from recovery.demo.fleet import A100_CLUSTER, H100_CLUSTER, seed_demo_cluster
from recovery.loop.replay import DIFFERENT
from recovery.loop.replay_view import ClusterReplay
from recovery.models import Anomaly, AuditEvent, Policy, Recommendation
from recovery.roles import VIEWER
from tests.conftest import TEST_PASSWORD

pytestmark = pytest.mark.django_db


@pytest.fixture
def superuser(django_user_model: type[User]) -> User:
    return django_user_model.objects.create_superuser("root", "root@example.org", TEST_PASSWORD)


@pytest.fixture
def client(superuser: User) -> Client:
    client = Client()
    assert client.login(username=superuser.username, password=TEST_PASSWORD)
    return client


@pytest.fixture
def policy() -> Policy:
    """demo-a100, scoped to its cluster, with a budget of two attempts; its history up to now."""
    seed_demo_cluster()
    return Policy.objects.get(name="demo-a100")


def change_url(policy: Policy) -> str:
    return reverse("admin:recovery_policy_change", args=[policy.pk])


def form_data(client: Client, url: str, **changes: Any) -> dict[str, Any]:
    """The form as the admin shows it, with ``changes``: what a browser posts."""
    form = client.get(url).context["adminform"].form
    data: dict[str, Any] = {}
    for name in form.fields:
        value = form[name].value()
        if isinstance(value, bool):
            if value:
                data[name] = "on"
        else:
            data[name] = "" if value is None else value
    for name, value in changes.items():
        if value is False:
            data.pop(name, None)
        else:
            data[name] = "on" if value is True else value
    return data


def stored() -> tuple[object, ...]:
    """Everything a preview must leave as it is."""
    return (
        list(Policy.objects.order_by("pk").values_list()),
        AuditEvent.objects.count(),
        LogEntry.objects.count(),
        list(Recommendation.objects.order_by("pk").values_list("pk", "status", "updated_at")),
        list(Anomaly.objects.order_by("pk").values_list("pk", "decided_at")),
    )


def previewed(response: Any) -> list[ClusterReplay]:
    replays = response.context["replays"]
    assert isinstance(replays, list)
    return replays


def test_the_form_offers_the_preview_with_seven_days(client: Client, policy: Policy) -> None:
    body = client.get(change_url(policy)).content.decode()
    assert 'name="_preview" value="Preview on the last 7 days"' in body
    assert 'name="_preview_days" id="policy-preview-days" value="7"' in body
    assert 'id="policy-preview"' not in body
    add = client.get(reverse("admin:recovery_policy_add")).content.decode()
    assert 'name="_preview"' in add


def test_a_preview_of_a_raised_budget_shows_the_differences_and_saves_nothing(
    client: Client, policy: Policy
) -> None:
    url = change_url(policy)
    before = stored()
    data = form_data(client, url, max_attempts="10", _preview="Preview", _preview_days="7")
    response = client.post(url, data)
    body = response.content.decode()

    assert response.status_code == 200
    (replay,) = previewed(response)  # the policy's scope is its cluster
    assert replay.cluster_name == A100_CLUSTER
    assert {row.verdict for row in replay.differences} == {DIFFERENT}
    stops = next(row for row in replay.totals if row.key == "stops")
    assert stops.changed and stops.recorded is not None and stops.replayed < stops.recorded
    assert 'id="policy-preview"' in body and "Nothing was saved." in body
    assert 'data-verdict="different"' in body
    assert "the draft (demo-a100) decides differently" in body
    # The form is shown again with the edit kept, and without errors.
    assert 'name="max_attempts" value="10"' in body
    assert "errornote" not in body
    assert stored() == before
    assert Policy.objects.get(pk=policy.pk).max_attempts == 2


def test_a_policy_for_every_cluster_is_previewed_on_each(client: Client, policy: Policy) -> None:
    url = change_url(policy)
    before = stored()
    response = client.post(url, form_data(client, url, cluster="", _preview="Preview"))
    assert response.status_code == 200
    assert [r.cluster_name for r in previewed(response)] == [A100_CLUSTER, H100_CLUSTER]
    assert stored() == before


def test_a_new_policy_is_previewed_without_being_added(client: Client, policy: Policy) -> None:
    """GIVEN the demo history of demo-a100, whose policy is then deleted
    WHEN a new policy for that cluster with a budget of ten attempts is previewed on the add form
    THEN it restarts where demo-a100 stopped, and it is not added"""
    cluster_id = policy.cluster_id
    policy.delete()
    url = reverse("admin:recovery_policy_add")
    before = stored()
    data = form_data(
        client, url, name="lab", cluster=str(cluster_id), max_attempts="10", _preview="Preview"
    )
    response = client.post(url, data)
    assert response.status_code == 200
    (replay,) = previewed(response)
    assert DIFFERENT in {row.verdict for row in replay.differences}
    assert "(not saved)" in replay.policy
    assert 'name="name" value="lab"' in response.content.decode()
    assert stored() == before
    assert not Policy.objects.filter(name="lab").exists()


def test_an_invalid_value_shows_the_error_and_no_preview(client: Client, policy: Policy) -> None:
    url = change_url(policy)
    before = stored()
    response = client.post(url, form_data(client, url, max_attempts="0", _preview="Preview"))
    body = response.content.decode()
    assert response.status_code == 200
    assert "errornote" in body
    assert response.context["adminform"].form.errors["max_attempts"]
    assert "replays" not in response.context
    assert 'id="policy-preview"' not in body
    assert stored() == before


@pytest.mark.parametrize("days", ["0", "91", "soon"])
def test_days_out_of_range_are_refused_and_nothing_is_run(
    client: Client, policy: Policy, days: str
) -> None:
    url = change_url(policy)
    data = form_data(client, url, max_attempts="10", _preview="Preview", _preview_days=days)
    response = client.post(url, data)
    body = response.content.decode()
    assert response.status_code == 200
    assert "a whole number from 1 to 90" in body
    assert "replays" not in response.context
    assert Policy.objects.get(pk=policy.pk).max_attempts == 2


def test_save_still_saves(client: Client, policy: Policy) -> None:
    url = change_url(policy)
    response = client.post(url, form_data(client, url, max_attempts="10", _save="Save"))
    assert response.status_code == 302
    assert Policy.objects.get(pk=policy.pk).max_attempts == 10
    assert LogEntry.objects.filter(object_id=str(policy.pk)).exists()


def test_a_viewer_may_not_preview(client: Client, policy: Policy, make_user: Any) -> None:
    """Previewing posts the change form: a person who may not change policies is refused."""
    viewer = make_user("vic", VIEWER, is_staff=True)
    url = change_url(policy)
    data = form_data(client, url, max_attempts="10", _preview="Preview")
    other = Client()
    assert other.login(username=viewer.username, password=TEST_PASSWORD)
    assert other.post(url, data).status_code == 403
