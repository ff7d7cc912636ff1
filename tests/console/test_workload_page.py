"""The workload page tells one story: its latest action as later facts left it, the root cause
before what followed from it, node and rank lists written short, and the cluster's
controllers beside the recommendations."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from recovery.audit.record import record_event
from recovery.choices import (
    AnomalyKind,
    AttemptExitState,
    AuditKind,
    ClusterMode,
    FailureCategory,
    RecommendationAction,
    RecommendationStatus,
    WorkloadState,
)
from recovery.demo.fleet import seed_demo_cluster
from recovery.models import ControllerToken, Recommendation, Workload
from recovery.read.timeline import (
    CASCADE,
    ROOT_CAUSE,
    WITNESS,
    action_standings,
    anomalies_in_causal_order,
    latest_action,
    story_events,
)
from tests.conftest import TEST_PASSWORD
from tests.factories import (
    AnomalyFactory,
    AttemptFactory,
    ClusterFactory,
    RecommendationFactory,
    WorkloadFactory,
)

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def logged_in(user: User) -> Client:
    client = Client()
    assert client.login(username=user.username, password=TEST_PASSWORD)
    return client


def page(user: User, workload: Workload) -> str:
    response = logged_in(user).get(reverse("console:workload", args=[workload.pk]))
    assert response.status_code == 200
    return response.content.decode()


def text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html)).strip()


def event(
    workload: Workload, seconds: float, kind: str, attempt: int | None, **payload: Any
) -> None:
    record_event(
        cluster=workload.cluster,
        workload=workload,
        attempt=attempt,
        kind=kind,
        actor="test",
        payload=payload,
        occurred_at=at(seconds),
    )


def shown(html: str, element_id: str) -> str:
    """The inside of the paragraph with this id or test id."""
    start = html.index(">", html.index(f'id="{element_id}"')) + 1
    return html[start : html.index("</p>", start)]


@pytest.fixture
def stopped_then_restarted() -> Workload:
    """
    Attempt 1 fails at 100 (an Xid, then the surviving ranks time out, then Slurm's node
    failure); a stop is recommended at 110, approved, and carried out at 120; the job is
    requeued anyway at 125 and attempt 2 starts at 150, running still.
    """
    workload = WorkloadFactory(
        cluster=ClusterFactory(),
        state=WorkloadState.RUNNING,
        current_attempt=2,
        submit_time=at(-60),
    )
    first = AttemptFactory(
        workload=workload,
        number=1,
        nodes=[f"gpu-a100-{n:03d}" for n in range(1, 9)],
        started_at=at(0),
        ended_at=at(101),
        exit_state=AttemptExitState.NODE_FAIL,
    )
    AttemptFactory(
        workload=workload,
        number=2,
        nodes=[f"gpu-a100-{n:03d}" for n in (1, 2, 3, 4, 5, 6, 8, 9)],
        excluded_nodes=["gpu-a100-007"],
        started_at=at(150),
        exit_state=AttemptExitState.RUNNING,
    )
    xid = AnomalyFactory(
        workload=workload,
        attempt=first,
        category=FailureCategory.GPU_HARDWARE,
        signature="xid_79_fallen_off_bus",
        implicated_nodes=["gpu-a100-007"],
        implicated_ranks=[50],
        details={"role": "cause"},
        evidence_at=at(90),
        detected_at=at(91),
    )
    AnomalyFactory(
        workload=workload,
        attempt=first,
        category=FailureCategory.NCCL_TIMEOUT,
        signature="nccl_watchdog_timeout",
        implicated_nodes=[f"gpu-a100-{n:03d}" for n in range(8, 0, -1)],
        implicated_ranks=[r for r in range(64) if r != 50],
        details={"role": "symptom"},
        evidence_at=at(99),
        detected_at=at(99),
    )
    AnomalyFactory(
        workload=workload,
        attempt=first,
        kind=AnomalyKind.CRASH,
        category=FailureCategory.SCHEDULER_EVENT,
        signature="slurm_node_failure",
        implicated_nodes=["gpu-a100-007"],
        details={"role": "cause"},
        evidence_at=at(101),
        detected_at=at(102),
    )
    stop = RecommendationFactory(
        workload=workload,
        attempt=first,
        anomaly=xid,
        action=RecommendationAction.STOP,
        excluded_nodes=[],
        status=RecommendationStatus.EXECUTED,
        created_at=at(110),
    )
    event(workload, 0, AuditKind.STATE_CHANGED, 1, to="running")
    event(workload, 91, AuditKind.DETECTED, 1, evidence_at=at(90).isoformat())
    event(workload, 101, AuditKind.STATE_CHANGED, 1, to="failed")
    event(workload, 115, AuditKind.APPROVED, 1, recommendation=stop.pk, action="stop")
    event(workload, 120, AuditKind.SCHEDULER_ACTION, 1, recommendation=stop.pk, action="stop")
    event(workload, 120, AuditKind.STATE_CHANGED, 1, to="stopped")
    event(workload, 125, AuditKind.STATE_CHANGED, 1, to="requeued")
    event(workload, 150, AuditKind.STATE_CHANGED, 2, to="running")
    return workload


# ---------- the latest action and what overtook it ----------


def test_a_stop_followed_by_a_new_attempt_is_shown_overtaken(
    viewer: User, stopped_then_restarted: Workload
) -> None:
    """
    GIVEN a stop carried out at 120, then attempt 2 started at 150 and runs
    WHEN a viewer opens the workload
    THEN the header says the stop was overtaken by attempt 2, beside the Running state, and
         the recommendation says so too
    """
    body = page(viewer, stopped_then_restarted)
    head = text(body[body.index('id="workload-summary"') : body.index('class="facts"')])
    started = timezone.localtime(at(150)).strftime("%Y-%m-%d %H:%M:%S")
    assert "Running" in head
    assert "Latest action: Stop · Executed" in head
    assert f"overtaken: attempt 2 started at {started}" in head
    assert "the job is running now" in head
    stop = Recommendation.objects.get(workload=stopped_then_restarted)
    note = text(shown(body, f"overtaken-{stop.pk}"))
    assert note.startswith("Executed at ")
    assert f"overtaken: attempt 2 started at {started}" in note
    assert 'class="badge badge--overtaken"' in body


def test_a_stop_that_held_is_not_overtaken(viewer: User) -> None:
    workload = WorkloadFactory(state=WorkloadState.STOPPED, current_attempt=1)
    attempt = AttemptFactory(workload=workload, number=1, started_at=at(0), ended_at=at(100))
    stop = RecommendationFactory(
        workload=workload,
        attempt=attempt,
        action=RecommendationAction.STOP,
        status=RecommendationStatus.EXECUTED,
        created_at=at(105),
    )
    event(workload, 110, AuditKind.SCHEDULER_ACTION, 1, recommendation=stop.pk)
    event(workload, 110, AuditKind.STATE_CHANGED, 1, to="stopped")

    body = page(viewer, workload)

    head = text(shown(body, "latest-action"))
    assert head.startswith("Latest action: Stop · Executed")
    assert "overtaken" not in body.split('id="workload-goodput"')[0]


def test_a_restart_is_overtaken_by_a_cancellation_not_by_its_own_attempt() -> None:
    workload = WorkloadFactory(state=WorkloadState.CANCELLED, current_attempt=2)
    first = AttemptFactory(workload=workload, number=1, started_at=at(0), ended_at=at(100))
    restart = RecommendationFactory(
        workload=workload,
        attempt=first,
        status=RecommendationStatus.EXECUTED,
        created_at=at(105),
    )
    event(workload, 110, AuditKind.SCHEDULER_ACTION, 1, recommendation=restart.pk)
    event(workload, 112, AuditKind.STATE_CHANGED, 1, to="requeued")
    attempts = list(workload.attempts.order_by("number"))

    standing = action_standings([restart], attempts, story_events(workload))[restart.pk]
    assert standing.acted_at == at(110)
    assert not standing.overtaken  # requeued: what the restart does

    event(workload, 130, AuditKind.STATE_CHANGED, 1, to="cancelled")
    standing = action_standings([restart], attempts, story_events(workload))[restart.pk]
    assert standing.overtaken_by is not None
    assert standing.overtaken_by.what == "the job was cancelled"
    assert standing.overtaken_by.at == at(130)

    # Once the new attempt has started, a later cancellation is its own story.
    AttemptFactory(workload=workload, number=2, started_at=at(120))
    attempts = list(workload.attempts.order_by("number"))
    standing = action_standings([restart], attempts, story_events(workload))[restart.pk]
    assert not standing.overtaken


def test_the_latest_action_is_the_newest_recommendation_still_standing() -> None:
    workload = WorkloadFactory()
    old = RecommendationFactory(workload=workload, created_at=at(10))
    newer = RecommendationFactory(
        workload=workload, status=RecommendationStatus.SUPERSEDED, created_at=at(20)
    )
    recommendations = [newer, old]
    standings = action_standings(recommendations, [], [])
    found = latest_action(recommendations, standings)
    assert found is not None and found.recommendation == old
    assert latest_action([], {}) is None


def test_the_demo_job_restarted_without_its_failed_node_tells_one_story(viewer: User) -> None:
    """
    GIVEN the demo fleet, whose job 48213 lost gpu-a100-007 (Xid 79), had the approved restart
          without it carried out, and runs attempt 2
    WHEN a viewer opens it
    THEN the header's state and its latest action agree, and the Xid leads the anomalies
    """
    seed_demo_cluster()
    workload = Workload.objects.get(job_id="48213")
    assert workload.state == WorkloadState.RUNNING
    body = page(viewer, workload)
    head = text(shown(body, "latest-action"))
    assert head.startswith("Latest action: Restart excluding nodes · Executed at ")
    assert "overtaken" not in head
    # The Xid the restart was made on leads the anomalies, the consequences follow.
    roles = re.findall(
        r'<article class="anomaly[^"]*" id="anomaly-\d+"[^>]*data-role="(\w+)"', body
    )
    assert roles == [ROOT_CAUSE, CASCADE, WITNESS]


# ---------- anomalies: the root cause first ----------


def test_the_root_cause_leads_the_anomalies_and_the_rest_follow_in_time(
    viewer: User, stopped_then_restarted: Workload
) -> None:
    body = page(viewer, stopped_then_restarted)
    section = body[body.index('id="workload-anomalies"') : body.index('id="workload-attempts"')]
    articles = re.findall(
        r'<article class="anomaly[^"]*" id="anomaly-(\d+)"[^>]*data-role="(\w+)"', section
    )
    signatures = re.findall(r"<dt>Signature</dt><dd[^>]*>([^<]+)</dd>", section)
    assert signatures == ["xid_79_fallen_off_bus", "nccl_watchdog_timeout", "slurm_node_failure"]
    assert [role for _, role in articles] == [ROOT_CAUSE, CASCADE, WITNESS]
    root_id = articles[0][0]
    assert section.count(">Root cause</span>") == 1
    assert section.count(f'of root cause <a href="#anomaly-{root_id}">#{root_id}</a>') == 2


def test_anomalies_of_newer_attempts_come_first_each_led_by_its_root() -> None:
    workload = WorkloadFactory()
    first = AttemptFactory(workload=workload, number=1, started_at=at(0))
    second = AttemptFactory(workload=workload, number=2, started_at=at(200))
    one = AnomalyFactory(workload=workload, attempt=first, detected_at=at(50))
    two_wrapper = AnomalyFactory(
        workload=workload, attempt=second, detected_at=at(240), details={"role": "wrapper"}
    )
    two = AnomalyFactory(workload=workload, attempt=second, detected_at=at(250))
    orphan = AnomalyFactory(workload=workload, attempt=None, detected_at=at(100))
    recommendations = [
        RecommendationFactory(workload=workload, anomaly=one, created_at=at(60)),
        RecommendationFactory(workload=workload, anomaly=two, created_at=at(260)),
    ]
    attempts = [first, second]

    entries = anomalies_in_causal_order([orphan, two, two_wrapper, one], recommendations, attempts)

    assert [(e.anomaly, e.role) for e in entries] == [
        (two, ROOT_CAUSE),
        (two_wrapper, CASCADE),
        (one, ROOT_CAUSE),
        (orphan, WITNESS),  # detected while attempt 1 ran: placed in it
    ]
    assert entries[1].root_id == two.pk


def test_without_a_recommendation_anomalies_are_in_time_order_unmarked() -> None:
    workload = WorkloadFactory()
    attempt = AttemptFactory(workload=workload, number=1, started_at=at(0))
    late = AnomalyFactory(workload=workload, attempt=attempt, detected_at=at(20))
    early = AnomalyFactory(workload=workload, attempt=attempt, detected_at=at(10))
    entries = anomalies_in_causal_order([late, early], [], [attempt])
    assert [(e.anomaly, e.role) for e in entries] == [(early, ""), (late, "")]


def test_a_root_cause_older_than_the_page_is_still_listed(
    viewer: User, stopped_then_restarted: Workload
) -> None:
    second = stopped_then_restarted.attempts.get(number=2)
    for n in range(55):
        AnomalyFactory(
            workload=stopped_then_restarted,
            attempt=second,
            kind=AnomalyKind.STRAGGLER,
            evidence_at=at(200 + n),
            detected_at=at(200 + n),
        )
    body = page(viewer, stopped_then_restarted)
    assert body.count('<article class="anomaly') == 50
    assert body.count(">Root cause</span>") == 1
    assert "The newest 50 anomalies" in body


# ---------- node and rank lists written short ----------


def test_rank_and_node_lists_are_written_short_with_the_whole_list_on_hover(
    viewer: User, stopped_then_restarted: Workload
) -> None:
    body = page(viewer, stopped_then_restarted)
    anomalies = body[body.index('id="workload-anomalies"') : body.index('id="workload-attempts"')]
    every_rank = ", ".join(str(r) for r in range(64) if r != 50)
    assert f'<span title="{every_rank}">0-49,51-63</span> <span class="muted">(63)</span>' in (
        anomalies
    )
    every_node = ", ".join(f"gpu-a100-{n:03d}" for n in range(1, 9))
    assert f'<span title="{every_node}">gpu-a100-[001-008]</span>' in anomalies
    assert "0, 1, 2, 3, 4" not in anomalies.replace(f'title="{every_rank}"', "")
    attempts = body[body.index('id="workload-attempts"') :]
    assert ">gpu-a100-[001-008]</span>" in attempts
    assert ">gpu-a100-[001-006,008-009]</span>" in attempts
    assert 'node-excluded" title="gpu-a100-007">gpu-a100-007</span>' in attempts


# ---------- the cluster's controllers ----------


def test_the_clusters_controllers_are_shown_beside_the_recommendations(
    viewer: User, stopped_then_restarted: Workload
) -> None:
    cluster = stopped_then_restarted.cluster
    response = logged_in(viewer).get(reverse("console:workload", args=[stopped_then_restarted.pk]))
    assert "No controller token is issued for" in response.context["wait_warning"]
    body = response.content.decode()
    section = body[body.index('id="workload-recommendations"') :]
    section = section[: section.index("</section>")]
    assert f'class="controllers-seen controllers-seen--silent" data-cluster="{cluster.name}"' in (
        section
    )

    ControllerToken.objects.create(
        cluster=cluster,
        name="slurm-advisor-1",
        key_prefix="abc",
        key_hash="0" * 64,
        last_used_at=timezone.now(),
    )
    response = logged_in(viewer).get(reverse("console:workload", args=[stopped_then_restarted.pk]))
    assert response.context["wait_warning"] == ""
    assert "slurm-advisor-1" in response.content.decode()


def test_a_job_outside_the_clusters_canary_is_said_to_act_only_on_approval(
    viewer: User,
) -> None:
    cluster = ClusterFactory(
        mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True, action_partitions=["canary"]
    )
    inside = WorkloadFactory(cluster=cluster, partition="canary", job_id="501")
    outside = WorkloadFactory(cluster=cluster, partition="batch", job_id="502")
    assert "action mode for partition canary: this job is in that canary" in text(
        page(viewer, inside)
    )
    assert (
        "action mode for partition canary: this job is outside that canary and acts only on "
        "approval" in text(page(viewer, outside))
    )
