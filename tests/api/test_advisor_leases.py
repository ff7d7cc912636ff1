"""Advisor API lease rules: deadlines hold without the watchdog, reports only from the holder
(refusals audited), renewals for long actions, ``retry`` gives a recommendation back, and a
controller can ask which cluster its token serves. A lease is held by a controller process (its
instance id), not by its token, and a controller that sends no instance id is told to upgrade."""

from __future__ import annotations

import io
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from api.advisor import OLD_CONTROLLER
from recovery.choices import AuditKind, ClusterMode, RecommendationStatus
from recovery.controller import cli
from recovery.controller.client import INSTANCE_HEADER, AdvisorAPIError, AdvisorClient
from recovery.controller.controller import AdvisorController
from recovery.models import AuditEvent, ControllerToken, Recommendation
from recovery.schedulers.slurm import SlurmAdapter
from recovery.schedulers.transport import LocalTransport
from tests.api.test_advisor import EXECUTED, claim, controller, ready_recommendation, report
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db


def renew(client: Any, recommendation: Recommendation, **body: Any) -> Any:
    url = reverse("api:advisor-renew", args=[recommendation.pk])
    return client.post(url, body, format="json")


def test_a_recommendation_past_its_deadline_is_neither_listed_nor_claimable() -> None:
    cluster = ClusterFactory()
    stale = ready_recommendation(cluster, expires_at=timezone.now() - timedelta(seconds=1))
    fresh = ready_recommendation(cluster, expires_at=timezone.now() + timedelta(minutes=5))
    client = controller(cluster)
    listed = client.get(reverse("api:advisor-ready")).json()["results"]
    assert [r["id"] for r in listed] == [fresh.pk]
    response = claim(client, stale)
    assert response.status_code == 409
    assert "past its deadline" in response.json()["error"]
    stale.refresh_from_db()
    assert stale.status == RecommendationStatus.READY
    assert not AuditEvent.objects.filter(kind=AuditKind.CLAIMED).exists()


def test_an_expired_lease_past_the_deadline_is_not_claimed_again() -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(
        cluster,
        status=RecommendationStatus.CLAIMED,
        lease_owner="controller:gone",
        lease_expires_at=timezone.now() - timedelta(seconds=5),
        expires_at=timezone.now() - timedelta(seconds=1),
    )
    assert claim(controller(cluster), recommendation).status_code == 409


def test_the_recommendation_names_the_jobs_user_and_submit_time() -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    body = claim(controller(cluster), recommendation).json()
    assert body["user"] == recommendation.workload.user
    assert body["submit_time"].startswith(recommendation.workload.submit_time.strftime("%Y-%m-%d"))


def test_a_report_after_another_controller_took_over_is_refused_and_audited() -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    slow, fast = controller(cluster, "slow"), controller(cluster, "fast")
    assert claim(slow, recommendation, lease_seconds=10).status_code == 200
    Recommendation.objects.filter(pk=recommendation.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert claim(fast, recommendation).status_code == 200
    response = report(slow, recommendation, **EXECUTED)
    assert response.status_code == 409
    recommendation.refresh_from_db()
    assert (recommendation.status, recommendation.lease_owner) == ("claimed", "controller:fast")
    refused = AuditEvent.objects.get(kind=AuditKind.REPORT_REFUSED)
    assert refused.actor == "controller:slow"
    assert refused.payload["commands"][0]["argv"] == ["scontrol", "requeuehold", "4242"]
    assert "controller:fast" in refused.payload["refused"]
    assert not AuditEvent.objects.filter(kind=AuditKind.SCHEDULER_ACTION).exists()


def test_a_lease_that_ran_out_unclaimed_still_takes_its_holders_report() -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    client = controller(cluster)
    claim(client, recommendation, lease_seconds=10)
    Recommendation.objects.filter(pk=recommendation.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert report(client, recommendation, **EXECUTED).status_code == 200
    assert AuditEvent.objects.filter(kind=AuditKind.SCHEDULER_ACTION).count() == 1


def test_the_holder_renews_its_lease_and_nobody_else_can() -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    holder, other = controller(cluster, "holder"), controller(cluster, "other")
    claim(holder, recommendation, lease_seconds=10)
    before = Recommendation.objects.get(pk=recommendation.pk).lease_expires_at
    response = renew(holder, recommendation, lease_seconds=600)
    assert response.status_code == 200
    after = Recommendation.objects.get(pk=recommendation.pk).lease_expires_at
    assert before is not None and after is not None
    assert after - before > timedelta(seconds=500)
    assert renew(other, recommendation, lease_seconds=600).status_code == 409
    assert renew(holder, recommendation, lease_seconds=1).status_code == 400


def test_a_retry_gives_the_recommendation_back_with_what_was_done() -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    client = controller(cluster)
    claim(client, recommendation)
    half_done = {
        "outcome": "retry",
        "state_before": {"job_state": "RUNNING"},
        "commands": [{"argv": ["scontrol", "requeuehold", "4242"], "returncode": 0}],
        "converged": False,
        "detail": "the SSH connection dropped after requeuehold",
    }
    assert report(client, recommendation, **half_done).status_code == 200
    recommendation.refresh_from_db()
    assert (recommendation.status, recommendation.lease_owner) == ("ready", "")
    event = AuditEvent.objects.get(kind=AuditKind.ACTION_RETRY)
    assert event.payload["commands"][0]["argv"][1] == "requeuehold"
    # Claimable again, by any controller of the cluster.
    assert claim(controller(cluster, "next"), recommendation).status_code == 200


def test_a_controller_learns_which_cluster_its_token_serves() -> None:
    cluster = ClusterFactory(connection_settings={"scheduler_cluster_name": "a100"})
    instance = str(uuid.uuid4())
    response = controller(cluster, "ctl-1", instance=instance).get(reverse("api:advisor-identity"))
    assert response.status_code == 200
    assert response.json() == {
        "cluster": cluster.name,
        "scheduler_cluster_name": "a100",
        "actor": "controller:ctl-1",
        "instance": instance,
        "acts_without_approval": "nothing (monitor mode, or action mode not acknowledged)",
    }
    plain = ClusterFactory()
    named = controller(plain).get(reverse("api:advisor-identity")).json()
    assert named["scheduler_cluster_name"] == plain.name


def test_a_controller_learns_what_the_canary_lets_it_do_without_an_approval() -> None:
    cluster = ClusterFactory(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True)
    process = controller(cluster)
    said = process.get(reverse("api:advisor-identity")).json()
    assert said["acts_without_approval"] == "every opted-in job"
    cluster.action_partitions = ["canary"]
    cluster.action_share_percent = 10
    cluster.save()
    said = process.get(reverse("api:advisor-identity")).json()
    assert said["acts_without_approval"] == "jobs in partition canary and 10 % of jobs"


class Process(APIClient):
    """One controller process: the token it was started with, the instance id it made."""

    def __init__(self, key: str) -> None:
        super().__init__()
        self.instance = str(uuid.uuid4())
        self.credentials(
            HTTP_AUTHORIZATION=f"Bearer {key}", HTTP_X_CONTROLLER_INSTANCE=self.instance
        )


def same_token_processes(cluster: Any) -> tuple[Process, Process]:
    """Two controller processes started with one token."""
    _, key = ControllerToken.issue(cluster, "slurm-advisor-1")
    return Process(key), Process(key)


def test_the_claim_names_the_controller_process_that_holds_the_lease() -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    first, _ = same_token_processes(cluster)
    body = claim(first, recommendation).json()
    assert (body["lease_owner"], body["lease_instance"]) == (
        "controller:slurm-advisor-1",
        first.instance,
    )
    event = AuditEvent.objects.get(kind=AuditKind.CLAIMED)
    assert event.actor == "controller:slurm-advisor-1"
    assert event.payload["controller_instance"] == first.instance


def test_a_second_process_on_the_same_token_cannot_renew_or_report_the_first_ones_lease() -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    first, second = same_token_processes(cluster)
    assert claim(first, recommendation, lease_seconds=60).status_code == 200
    response = renew(second, recommendation, lease_seconds=600)
    assert response.status_code == 409
    assert "another process with the same token holds it" in response.json()["error"]
    assert report(second, recommendation, **EXECUTED).status_code == 409
    assert claim(second, recommendation).status_code == 409
    recommendation.refresh_from_db()
    assert recommendation.lease_instance == first.instance
    assert recommendation.status == RecommendationStatus.CLAIMED
    # The holder is not disturbed.
    assert renew(first, recommendation, lease_seconds=600).status_code == 200
    assert report(first, recommendation, **EXECUTED).status_code == 200
    # A repeat of the report is a no-op for its holder only.
    assert report(first, recommendation, **EXECUTED).status_code == 200
    assert report(second, recommendation, **EXECUTED).status_code == 409
    assert AuditEvent.objects.filter(kind=AuditKind.SCHEDULER_ACTION).count() == 1


def test_a_retry_hands_the_lease_back_whole() -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    first, second = same_token_processes(cluster)
    claim(first, recommendation)
    retry = {"outcome": "retry", "state_before": {}, "commands": [], "detail": "read failed"}
    assert report(first, recommendation, **retry).status_code == 200
    recommendation.refresh_from_db()
    assert (recommendation.lease_owner, recommendation.lease_instance) == ("", "")
    assert claim(second, recommendation).status_code == 200


def advisor_calls(recommendation: Recommendation) -> dict[str, tuple[str, str, dict[str, Any]]]:
    def url(what: str) -> str:
        return reverse(f"api:advisor-{what}", args=[recommendation.pk])

    return {
        "identity": ("get", reverse("api:advisor-identity"), {}),
        "claim": ("post", url("claim"), {}),
        "renew": ("post", url("renew"), {}),
        "dispatch": ("post", url("dispatch"), {"argv": ["scontrol", "hold", "1"], "sequence": 1}),
        "report": ("post", url("report"), EXECUTED),
    }


@pytest.mark.parametrize("call", ["identity", "claim", "renew", "dispatch", "report"])
def test_a_controller_that_sends_no_instance_id_is_told_to_upgrade(call: str) -> None:
    """A controller of an earlier release sends its token only: it gets a clear 400 at its first
    call (identity, at start) and changes nothing anywhere."""
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    _, key = ControllerToken.issue(cluster, "slurm-advisor-1")
    old = APIClient()
    old.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    method, url, body = advisor_calls(recommendation)[call]
    response = getattr(old, method)(url, body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"] == OLD_CONTROLLER
    assert response.json()["code"] == "controller_instance_required"
    assert "upgrade the controller" in OLD_CONTROLLER
    recommendation.refresh_from_db()
    assert (recommendation.status, recommendation.lease_owner) == (RecommendationStatus.READY, "")
    assert not AuditEvent.objects.exists()


@pytest.mark.parametrize("instance", ["", "not-a-uuid", "x" * 300])
def test_an_instance_id_that_is_not_a_uuid_is_refused(instance: str) -> None:
    cluster = ClusterFactory()
    recommendation = ready_recommendation(cluster)
    _, key = ControllerToken.issue(cluster, "slurm-advisor-1")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}", HTTP_X_CONTROLLER_INSTANCE=instance)
    response = claim(client, recommendation)
    assert response.status_code == 400
    assert "X-Controller-Instance" in response.json()["error"]
    recommendation.refresh_from_db()
    assert recommendation.status == RecommendationStatus.READY


class EarlierReleaseClient(AdvisorClient):
    """The Advisor API client as controllers before instance ids sent it: the token alone."""

    def headers(self) -> dict[str, str]:
        return {key: value for key, value in super().headers().items() if key != INSTANCE_HEADER}


@pytest.mark.django_db(transaction=True)
def test_a_controller_of_an_earlier_release_does_not_start_and_says_why(live_server: Any) -> None:
    cluster = ClusterFactory(name="lab")
    ready_recommendation(cluster)
    _, key = ControllerToken.issue(cluster, "slurm-advisor-1")
    adapter = SlurmAdapter(LocalTransport())
    old = AdvisorController(EarlierReleaseClient(live_server.url, key), adapter)
    with pytest.raises(AdvisorAPIError) as refused:
        old.check_identity("lab")
    assert refused.value.status == 400
    assert "upgrade the controller" in str(refused.value)
    options = cli.ControllerOptions.from_parsed(
        {
            "cluster": "lab", "url": live_server.url, "token_file": None, "ssh": None,
            "known_hosts": None, "key": None, "slurm_conf": "", "simulated": False,
            "partitions": "", "interval": 0.1, "lease_seconds": 120, "once": True,
        }
    )  # fmt: skip
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(cli.ControllerExit, match="upgrade the controller"):
        cli.check_identity(old, options, out=out, err=err)
    assert "serves cluster" not in out.getvalue()
    assert Recommendation.objects.get().status == RecommendationStatus.READY
    assert not AuditEvent.objects.filter(kind=AuditKind.CLAIMED).exists()
    # The same controller of this release starts, and names its process.
    current = AdvisorController(AdvisorClient(live_server.url, key), adapter)
    assert current.api.identity().instance == current.api.instance  # type: ignore[attr-defined]
