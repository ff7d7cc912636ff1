"""Advisor API dispatch: a controller records each scheduler command before it runs it.

Only the holder of a running lease may: another controller, or the holder once its lease ran out
(taken over or not), gets a 409 and must run nothing. Each accepted call is one ``dispatched``
event with the exact argv.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from api.authentication import CONTROLLER_ONLY
from recovery.audit.payloads import payload_problems
from recovery.choices import AuditKind, RecommendationStatus
from recovery.loop import leases, recommendations
from recovery.models import AuditEvent, IngestToken, IngestTokenKind, Recommendation
from recovery.models.recommendation import InvalidTransition
from tests.api.test_advisor import EXECUTED, claim, controller, ready_recommendation, report
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db

REQUEUEHOLD = {"argv": ["scontrol", "requeuehold", "4242"], "sequence": 1}


def dispatch(client: APIClient, recommendation: Recommendation, body: Any = None) -> Any:
    url = reverse("api:advisor-dispatch", args=[recommendation.pk])
    return client.post(url, REQUEUEHOLD if body is None else body, format="json")


def dispatched() -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(kind=AuditKind.DISPATCHED).order_by("id"))


def test_the_lease_holder_records_the_command_it_is_about_to_run() -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    recommendation.workload.current_attempt = 2
    recommendation.workload.save()
    client = controller(cluster)
    claim(client, recommendation)
    response = dispatch(client, recommendation)
    assert response.status_code == 200
    (event,) = dispatched()
    assert response.json() == {"event": event.pk}
    recommendation.refresh_from_db()
    assert event.payload == {
        "recommendation": recommendation.pk,
        "action": recommendation.action,
        "argv": ["scontrol", "requeuehold", "4242"],
        "sequence": 1,
        "controller_instance": recommendation.lease_instance,
    }
    assert payload_problems(event.kind, event.payload) == []
    assert (event.actor, event.cluster, event.workload, event.attempt) == (
        "controller:slurm-advisor-1",
        cluster,
        recommendation.workload,
        2,
    )
    recommendation.refresh_from_db()
    assert recommendation.status == RecommendationStatus.CLAIMED  # nothing else changes


def test_each_command_is_one_event_with_its_exact_argv() -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    client = controller(cluster)
    claim(client, recommendation)
    exclude = ["scontrol", "update", "JobId=4242", "ExcNodeList=gpu-[001-002], gpu-9 "]
    assert dispatch(client, recommendation).status_code == 200
    assert dispatch(client, recommendation, {"argv": exclude, "sequence": 2}).status_code == 200
    assert dispatch(client, recommendation).status_code == 200  # sent again: recorded again
    assert [(e.payload["argv"], e.payload["sequence"]) for e in dispatched()] == [
        (REQUEUEHOLD["argv"], 1),
        (exclude, 2),  # kept as sent, spaces and all
        (REQUEUEHOLD["argv"], 1),
    ]


def test_another_controller_may_not_dispatch() -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    claim(controller(cluster, "holder"), recommendation)
    response = dispatch(controller(cluster, "other"), recommendation)
    assert response.status_code == 409
    error = response.json()["error"]
    assert re.search(
        r"held by controller:holder \(instance [0-9a-f-]{36}\), not by controller:other", error
    )
    assert dispatched() == []


@pytest.mark.parametrize(
    "status",
    [RecommendationStatus.READY, RecommendationStatus.AWAITING_APPROVAL],
)
def test_nobody_dispatches_for_an_unclaimed_recommendation(status: str) -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster, status=status)
    assert dispatch(controller(cluster), recommendation).status_code == 409
    assert dispatched() == []


def test_a_holder_whose_lease_ran_out_may_not_dispatch_even_if_nobody_took_over() -> None:
    """
    GIVEN a controller paused (SIGSTOP) past its lease, nobody having claimed it since
    WHEN it resumes and dispatches its next command
    THEN it is refused, and the recommendation stays with it until the next claimant comes
    """
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    client = controller(cluster)
    claim(client, recommendation)
    Recommendation.objects.filter(pk=recommendation.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    response = dispatch(client, recommendation)
    assert response.status_code == 409
    assert "ran out" in response.json()["error"]
    assert response.json()["code"] == "conflict"
    assert dispatched() == []
    # The next claimant may.
    successor = controller(cluster, "successor")
    assert claim(successor, recommendation).status_code == 200
    assert dispatch(successor, recommendation).status_code == 200
    assert dispatch(client, recommendation).status_code == 409
    assert [event.actor for event in dispatched()] == ["controller:successor"]


def test_a_renewed_lease_may_dispatch_and_a_reported_one_may_not() -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    client = controller(cluster)
    claim(client, recommendation, lease_seconds=10)
    Recommendation.objects.filter(pk=recommendation.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    renewed = client.post(
        reverse("api:advisor-renew", args=[recommendation.pk]), {"lease_seconds": 60}
    )
    assert renewed.status_code == 200
    assert dispatch(client, recommendation).status_code == 200
    assert report(client, recommendation, **EXECUTED).status_code == 200
    assert dispatch(client, recommendation).status_code == 409
    assert len(dispatched()) == 1


def test_another_clusters_recommendation_is_not_found() -> None:
    cluster_a, cluster_b = ClusterFactory(), ClusterFactory()
    theirs = ready_recommendation(cluster_b)
    claim(controller(cluster_b), theirs)
    client = controller(cluster_a)
    assert dispatch(client, theirs).status_code == 404
    missing = reverse("api:advisor-dispatch", args=[theirs.pk + 1000])
    assert client.post(missing, REQUEUEHOLD, format="json").status_code == 404
    assert dispatched() == []


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"argv": ["scancel", "4242"]},
        {"sequence": 1},
        {"argv": "scancel 4242", "sequence": 1},
        {"argv": [], "sequence": 1},
        {"argv": ["scancel", ""], "sequence": 1},
        {"argv": [["scancel"], "4242"], "sequence": 1},
        {"argv": ["x"] * 65, "sequence": 1},
        {"argv": ["scontrol", "x" * 4097], "sequence": 1},
        {"argv": ["scancel", "4242"], "sequence": 0},
        {"argv": ["scancel", "4242"], "sequence": -3},
        {"argv": ["scancel", "4242"], "sequence": "first"},
        {"argv": ["scancel", "4242"], "sequence": 10**9},
        {"argv": ["scancel", "4242"], "sequence": None},
    ],
)
def test_a_malformed_dispatch_gets_a_clear_error(body: dict[str, Any]) -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    client = controller(cluster)
    claim(client, recommendation)
    response = dispatch(client, recommendation, body)
    assert response.status_code == 400
    assert response.json()["error"] == "The request body is not valid."
    assert response.json()["fields"]
    assert dispatched() == []


def test_an_argv_too_large_to_keep_is_refused() -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    client = controller(cluster)
    claim(client, recommendation)
    body = {"argv": ["y" * 4000] * 20, "sequence": 1}  # 80 KB as JSON, each item in bounds
    response = dispatch(client, recommendation, body)
    assert response.status_code == 400
    assert "argv" in response.json()["fields"]


@pytest.mark.parametrize("kind", [IngestTokenKind.JOB, IngestTokenKind.HOOK])
def test_job_and_hook_tokens_cannot_dispatch(kind: IngestTokenKind) -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    claim(controller(cluster), recommendation)
    _, key = IngestToken.issue(
        cluster, kind, name="t", issued_by="olga", user="mallory" if kind == "job" else ""
    )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    response = dispatch(client, recommendation)
    assert response.status_code == 403
    assert response.json()["error"] == CONTROLLER_ONLY
    assert dispatched() == []


def test_a_person_or_nobody_cannot_dispatch(operator: Any) -> None:
    from tests.conftest import TEST_PASSWORD

    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    claim(controller(cluster), recommendation)
    person = APIClient()
    person.login(username=operator.username, password=TEST_PASSWORD)
    assert dispatch(person, recommendation).status_code in (401, 403)
    assert dispatch(APIClient(), recommendation).status_code in (401, 403)
    assert dispatched() == []


def test_a_revoked_controller_token_cannot_dispatch() -> None:
    from recovery.models import ControllerToken

    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    client = controller(cluster)
    claim(client, recommendation)
    ControllerToken.objects.update(revoked_at=timezone.now())
    assert dispatch(client, recommendation).status_code == 401
    assert dispatched() == []


def test_record_dispatch_refuses_what_no_controller_sends() -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    recommendations.claim(
        recommendation.pk, controller="controller:c1", instance="i-1", lease_seconds=60
    )
    bad: list[tuple[Any, Any]] = [([], 1), (["scancel", 4242], 1), (["scancel"], 0), (["x"], True)]
    for argv, sequence in bad:
        with pytest.raises(ValueError):
            leases.record_dispatch(
                recommendation.pk,
                controller="controller:c1",
                instance="i-1",
                argv=argv,
                sequence=sequence,
            )
    with pytest.raises(InvalidTransition):
        leases.record_dispatch(
            recommendation.pk,
            controller="controller:c2",
            instance="i-2",
            argv=["scancel", "1"],
            sequence=1,
        )
    event = leases.record_dispatch(
        recommendation.pk,
        controller="controller:c1",
        instance="i-1",
        argv=["scancel", "1"],
        sequence=1,
    )
    assert event.kind == AuditKind.DISPATCHED
