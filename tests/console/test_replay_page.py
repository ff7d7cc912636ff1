"""The replay page: a cluster's recorded decisions decided again under the policies in force or a
draft, for every Console role, with nothing written."""

from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from recovery.demo.fleet import A100_CLUSTER, seed_demo_cluster
from recovery.loop.replay import DIFFERENT
from recovery.loop.replay_view import ClusterReplay
from recovery.models import Anomaly, AuditEvent, Cluster, Policy, Recommendation
from tests.conftest import TEST_PASSWORD

pytestmark = pytest.mark.django_db


def logged_in(user: User) -> Client:
    client = Client()
    assert client.login(username=user.username, password=TEST_PASSWORD)
    return client


@pytest.fixture
def cluster() -> Cluster:
    """The demo fleet's history, recorded up to now (the page replays the last days)."""
    seed_demo_cluster()
    return Cluster.objects.get(name=A100_CLUSTER)


def url(cluster: Cluster, **query: object) -> str:
    path = reverse("console:replay", args=[cluster.pk])
    return f"{path}?{urlencode(query)}" if query else path


def stored() -> tuple[object, ...]:
    """Everything a replay must leave as it is."""
    return (
        AuditEvent.objects.count(),
        list(Recommendation.objects.order_by("pk").values_list("pk", "status", "updated_at")),
        list(Anomaly.objects.order_by("pk").values_list("pk", "decided_at")),
        list(Policy.objects.order_by("pk").values_list("pk", "max_attempts", "enabled")),
        list(Policy.objects.order_by("pk").values_list("updated_at", flat=True)),
        Policy.objects.count(),
    )


def replayed(response: object) -> ClusterReplay:
    (found,) = response.context["replays"]  # type: ignore[attr-defined]
    assert isinstance(found, ClusterReplay)
    return found


def totals(found: ClusterReplay) -> dict[str, tuple[float | None, float]]:
    return {row.key: (row.recorded, row.replayed) for row in found.totals}


def test_it_replays_the_policies_in_force_for_a_viewer(cluster: Cluster, viewer: User) -> None:
    response = logged_in(viewer).get(url(cluster))
    body = response.content.decode()
    assert response.status_code == 200
    assert "Nothing was changed" in body
    found = replayed(response)
    assert found.decisions > 0
    assert found.differences == []
    assert all(not row.changed for row in found.totals)
    assert "Every decision in the window is the same." in body
    assert 'data-total="restarts"' in body


def test_a_draft_raising_max_attempts_restarts_where_the_demo_stopped(
    cluster: Cluster, viewer: User
) -> None:
    policy = Policy.objects.get(name="demo-a100")
    before = stored()
    response = logged_in(viewer).get(
        url(cluster, days=7, policy=policy.pk, overrides=json.dumps({"max_attempts": 10}))
    )
    body = response.content.decode()
    assert response.status_code == 200
    found = replayed(response)
    assert found.with_draft
    assert {row.verdict for row in found.differences} == {DIFFERENT}
    first = found.differences[0]
    assert first.recorded == "stop"
    assert first.replayed.startswith("restart excluding gpu-a100-")
    assert 'data-verdict="different"' in body
    assert "the draft (demo-a100) decides differently" in body
    recorded_stops, draft_stops = totals(found)["stops"]
    recorded_restarts, draft_restarts = totals(found)["restarts"]
    assert recorded_stops is not None and recorded_restarts is not None
    assert draft_stops < recorded_stops and draft_restarts > recorded_restarts
    assert 'data-total="stops" data-changed' in body
    assert "With this draft" in body and "Nothing was changed" in body
    assert stored() == before
    assert Policy.objects.get(pk=policy.pk).max_attempts == 2


def test_a_disabled_policy_is_tried_as_if_enabled(cluster: Cluster, viewer: User) -> None:
    Policy.objects.filter(name="demo-a100").update(enabled=False)
    policy = Policy.objects.get(name="demo-a100")
    client = logged_in(viewer)

    # In force now: the built-in defaults, which differ from what demo-a100 decided.
    as_in_force = replayed(client.get(url(cluster)))
    assert as_in_force.differences
    assert "applies now" in as_in_force.differences[0].explanation

    # Tried as if enabled, the disabled policy decides as recorded; it stays disabled.
    tried = replayed(client.get(url(cluster, policy=policy.pk)))
    assert tried.differences == []
    assert not Policy.objects.get(pk=policy.pk).enabled


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"overrides": "{max_attempts: 10"}, "not JSON"),
        ({"overrides": "[1, 2]"}, "a JSON object of settings"),
        ({"overrides": '{"max_attemps": 10}'}, "not a policy setting: max_attemps"),
        ({"overrides": '{"max_attempts": -1}'}, "max_attempts:"),
        ({"overrides": '{"cluster": "nowhere"}'}, "no cluster is called"),
        ({"days": "0"}, "a whole number from 1 to 90"),
        ({"days": "91"}, "a whole number from 1 to 90"),
        ({"days": "a week"}, "a whole number from 1 to 90"),
        ({"policy": "999999"}, "Select a valid choice"),
    ],
)
def test_bad_input_is_refused_with_the_reason_and_nothing_is_run(
    cluster: Cluster, viewer: User, query: dict[str, str], message: str
) -> None:
    before = stored()
    response = logged_in(viewer).get(url(cluster, **query))
    body = response.content.decode()
    assert response.status_code == 400
    assert message in body
    assert response.context["replays"] == []
    assert "data-replay-cluster" not in body
    assert stored() == before


def test_anonymous_readers_log_in_and_outsiders_are_refused(
    cluster: Cluster, outsider: User
) -> None:
    response = Client().get(url(cluster))
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    assert logged_in(outsider).get(url(cluster)).status_code == 403


def test_it_reads_only(cluster: Cluster, operator: User) -> None:
    response = logged_in(operator).post(url(cluster), {"overrides": "{}"})
    assert response.status_code == 405


def test_an_unknown_cluster_is_404(db: None, viewer: User) -> None:
    response = logged_in(viewer).get(reverse("console:replay", args=[987654]))
    assert response.status_code == 404


def test_the_clusters_and_readiness_pages_link_to_it(cluster: Cluster, viewer: User) -> None:
    client = logged_in(viewer)
    link = f'href="{url(cluster)}" data-replay-link'
    assert link in client.get(reverse("console:clusters")).content.decode()
    assert link in client.get(reverse("console:readiness", args=[cluster.pk])).content.decode()
