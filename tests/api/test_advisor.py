"""The Advisor API: cluster-scoped tokens, one claimant at a time, reports recorded once."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from recovery.choices import AuditKind, EvidenceSource, EvidenceTrust, RecommendationStatus
from recovery.models import AuditEvent, Cluster, ControllerToken, Node, Recommendation
from tests.factories import (
    AnomalyFactory,
    ClusterFactory,
    RecommendationFactory,
    WorkloadFactory,
)

pytestmark = pytest.mark.django_db


def controller(cluster: Cluster, name: str = "slurm-advisor-1", *, instance: str = "") -> APIClient:
    """A controller process with a token of its own, sending its instance id as every one does."""
    _, key = ControllerToken.issue(cluster, name)
    client = APIClient()
    client.credentials(
        HTTP_AUTHORIZATION=f"Bearer {key}",
        HTTP_X_CONTROLLER_INSTANCE=instance or str(uuid.uuid4()),
    )
    return client


def ready_recommendation(cluster: Cluster, **fields: Any) -> Recommendation:
    values: dict[str, Any] = {"status": RecommendationStatus.READY}
    values.update(fields)
    return RecommendationFactory(workload=WorkloadFactory(cluster=cluster), **values)


def claim(client: APIClient, recommendation: Recommendation, **body: Any) -> Any:
    url = reverse("api:advisor-claim", args=[recommendation.pk])
    return client.post(url, body, format="json")


def report(client: APIClient, recommendation: Recommendation, **body: Any) -> Any:
    url = reverse("api:advisor-report", args=[recommendation.pk])
    return client.post(url, body, format="json")


EXECUTED = {
    "outcome": "executed",
    "state_before": {"job_state": "RUNNING", "restart_cnt": 0, "nodes": "node[001-002]"},
    "commands": [{"argv": ["scontrol", "requeuehold", "4242"], "returncode": 0}],
    "converged": True,
}


def test_a_controller_sees_only_its_clusters_ready_recommendations() -> None:
    cluster_a, cluster_b = ClusterFactory(), ClusterFactory()
    mine = ready_recommendation(cluster_a)
    ready_recommendation(cluster_b)
    ready_recommendation(cluster_a, status=RecommendationStatus.AWAITING_APPROVAL)
    response = controller(cluster_a).get(reverse("api:advisor-ready"))
    assert response.status_code == 200
    assert [r["id"] for r in response.json()["results"]] == [mine.pk]
    assert response.json()["results"][0]["job_id"] == mine.workload.job_id


def test_a_token_for_cluster_a_cannot_claim_cluster_b() -> None:
    cluster_a, cluster_b = ClusterFactory(), ClusterFactory()
    theirs = ready_recommendation(cluster_b)
    response = claim(controller(cluster_a), theirs)
    assert response.status_code == 404
    theirs.refresh_from_db()
    assert theirs.status == RecommendationStatus.READY


def test_only_one_controller_wins_a_claim() -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    first = claim(controller(cluster, "one"), recommendation, lease_seconds=60)
    second = claim(controller(cluster, "two"), recommendation)
    assert first.status_code == 200
    assert first.json()["lease_owner"] == "controller:one"
    assert second.status_code == 409
    assert "held by controller:one" in second.json()["error"]


def test_an_expired_lease_can_be_claimed_again() -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(
        cluster,
        status=RecommendationStatus.CLAIMED,
        lease_owner="controller:gone",
        lease_expires_at=timezone.now() - timedelta(seconds=1),
    )
    response = claim(controller(cluster, "two"), recommendation)
    assert response.status_code == 200
    event = AuditEvent.objects.get(kind=AuditKind.CLAIMED)
    assert event.payload["previous_owner"] == "controller:gone"


def test_a_report_is_recorded_once_with_the_commands_run() -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    client = controller(cluster)
    claim(client, recommendation)
    assert report(client, recommendation, **EXECUTED).status_code == 200
    assert report(client, recommendation, **EXECUTED).status_code == 200  # a retried reply
    recommendation.refresh_from_db()
    assert recommendation.status == RecommendationStatus.EXECUTED
    event = AuditEvent.objects.get(kind=AuditKind.SCHEDULER_ACTION)
    assert event.actor == "controller:slurm-advisor-1"
    assert event.payload["commands"][0]["argv"] == ["scontrol", "requeuehold", "4242"]
    assert event.payload["state_before"]["job_state"] == "RUNNING"
    assert event.payload["converged"] is True


def test_an_executed_exclusion_says_until_when_the_node_stays_out() -> None:
    cluster = ClusterFactory()
    Node.objects.create(cluster=cluster, name="gpu-002")
    Node.objects.create(cluster=cluster, name="gpu-003")
    recommendation = ready_recommendation(cluster, excluded_nodes=["gpu-002"])
    # The scheduler took gpu-002 out under the job: a site fact implicates it.
    AnomalyFactory(
        workload=recommendation.workload,
        implicated_nodes=["gpu-002"],
        evidence_source=EvidenceSource.SCHEDULER,
        evidence_trust=EvidenceTrust.SITE,
    )
    client = controller(cluster)
    claim(client, recommendation)
    report(client, recommendation, **EXECUTED)
    until = Node.objects.get(name="gpu-002").excluded_until
    assert until is not None
    assert timedelta(hours=23) < until - timezone.now() <= timedelta(hours=24)
    assert Node.objects.get(name="gpu-003").excluded_until is None


def test_a_skipped_report_says_it_was_already_done() -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    client = controller(cluster)
    claim(client, recommendation)
    response = report(client, recommendation, outcome="skipped", detail="restart_cnt already 1")
    assert response.status_code == 200
    assert AuditEvent.objects.filter(kind=AuditKind.ACTION_SKIPPED).count() == 1


def test_only_the_lease_holder_may_report() -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    claim(controller(cluster, "one"), recommendation)
    response = report(controller(cluster, "two"), recommendation, **EXECUTED)
    assert response.status_code == 409
    recommendation.refresh_from_db()
    assert recommendation.status == RecommendationStatus.CLAIMED


def test_a_report_without_a_claim_is_refused() -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    assert report(controller(cluster), recommendation, **EXECUTED).status_code == 409


@pytest.mark.parametrize(
    "body",
    [
        {"outcome": "done"},
        {"outcome": "executed", "commands": [{"argv": "scontrol requeue 1", "returncode": 0}]},
        {"outcome": "executed", "converged": "perhaps"},
    ],
)
def test_a_malformed_report_gets_a_clear_error(body: dict[str, Any]) -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    client = controller(cluster)
    claim(client, recommendation)
    response = report(client, recommendation, **body)
    assert response.status_code == 400
    assert response.json()["error"] == "The request body is not valid."
    assert response.json()["fields"]


@pytest.mark.parametrize("lease", [0, 5, 100000, "soon"])
def test_an_unreasonable_lease_is_refused(lease: Any) -> None:
    cluster = ClusterFactory()
    response = claim(controller(cluster), ready_recommendation(cluster), lease_seconds=lease)
    assert response.status_code == 400


def test_without_a_token_or_with_a_revoked_one_nothing_is_shown() -> None:
    cluster = ClusterFactory()
    ready_recommendation(cluster)
    assert APIClient().get(reverse("api:advisor-ready")).status_code in (401, 403)
    client = controller(cluster)
    ControllerToken.objects.update(revoked_at=timezone.now())
    response = client.get(reverse("api:advisor-ready"))
    assert response.status_code == 401
    assert "revoked" in response.json()["detail"]
    bogus = APIClient()
    bogus.credentials(HTTP_AUTHORIZATION="Bearer wrc_not-a-token")
    assert bogus.get(reverse("api:advisor-ready")).status_code == 401


def test_a_person_logged_in_is_not_a_controller(operator: Any) -> None:
    from tests.conftest import TEST_PASSWORD

    client = APIClient()
    client.login(username=operator.username, password=TEST_PASSWORD)
    assert client.get(reverse("api:advisor-ready")).status_code in (401, 403)


def test_the_command_issues_a_token_printed_once(capsys: pytest.CaptureFixture[str]) -> None:
    cluster = ClusterFactory(name="lab")
    call_command("create_controller_token", "--cluster", "lab", "--name", "advisor")
    key = capsys.readouterr().out.strip()
    token = ControllerToken.authenticate(key)
    assert token is not None and token.cluster == cluster
    assert key not in {token.key_hash, token.key_prefix}


def test_a_drain_reaches_the_controller_with_its_node_and_reason() -> None:
    cluster = ClusterFactory()
    node = Node.objects.create(cluster=cluster, name="gpu-002")
    drain = ready_recommendation(
        cluster,
        node=node,
        action="drain",
        excluded_nodes=[],
        reason="workload-recovery: hardware: gpu_hardware (xid-79) on gpu-002",
    )
    client = controller(cluster)
    [listed] = client.get(reverse("api:advisor-ready")).json()["results"]
    assert (listed["id"], listed["action"], listed["node"]) == (drain.pk, "drain", "gpu-002")
    assert listed["reason"].startswith("workload-recovery: ")
    claimed = claim(client, drain).json()
    assert claimed["node"] == "gpu-002"
