"""The readiness report: figures over hand-built recommendations and events, and the checklist."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone
from pytest_django import DjangoAssertNumQueries

from recovery.audit.actors import Actor
from recovery.audit.record import record_event
from recovery.choices import (
    AuditKind,
    Disposition,
    FailureCategory,
    RecommendationAction,
    RecommendationStatus,
)
from recovery.models import Attempt, Cluster, ControllerToken, Policy, Recommendation, Workload
from recovery.read.readiness import (
    DEFAULT_DAYS,
    DaysError,
    Half,
    Readiness,
    parse_days,
    readiness_of,
)
from recovery.read.readiness_checklist import MONITOR_TRIAL_DECISIONS, CheckState
from recovery.sources.provider_status import NO_PROVIDER_REASON, AttributionStatus
from tests.factories import AnomalyFactory, ClusterFactory, RecommendationFactory, WorkloadFactory

pytestmark = pytest.mark.django_db

NO_PROVIDER = AttributionStatus(None, True, NO_PROVIDER_REASON)
PROVIDER_OK = AttributionStatus("verdicts.example:8080", False, "provider answered")


@dataclass
class History:
    cluster: Cluster
    now: datetime
    by_name: dict[str, Recommendation]


def _workload(cluster: Cluster, partition: str, nodes: list[str]) -> tuple[Workload, Attempt]:
    workload = WorkloadFactory(cluster=cluster, partition=partition)
    attempt = Attempt.objects.create(workload=workload, number=1, nodes=nodes)
    return workload, attempt


def recommended(
    workload: Workload,
    attempt: Attempt | None,
    *,
    action: str,
    status: str,
    created_at: datetime,
    category: str = FailureCategory.GPU_HARDWARE,
    approved_after: float | None = None,
    decided_at_stored: bool = True,
    rejected_after: float | None = None,
    would_have_done: bool = True,
    in_action_scope: bool | None = None,
    disposition: str = "",
) -> Recommendation:
    """A recommendation the policy made at ``created_at`` with its ``recommended`` event, and
    the operator's decision (``approved_after`` / ``rejected_after`` seconds later)."""
    anomaly = AnomalyFactory(workload=workload, category=category)
    approved_by = "otto" if approved_after is not None else ""
    decided_by = "otto" if (approved_after or rejected_after) is not None else Actor.POLICY
    decided_at = None
    if approved_after is not None and decided_at_stored:
        decided_at = created_at + timedelta(seconds=approved_after)
    if rejected_after is not None:
        decided_at = created_at + timedelta(seconds=rejected_after)
    recommendation = RecommendationFactory(
        workload=workload,
        attempt=attempt,
        anomaly=anomaly,
        action=action,
        excluded_nodes=[],
        status=status,
        approved_by=approved_by,
        decided_by=decided_by,
        decided_at=decided_at,
        created_at=created_at,
        disposition=disposition,
    )
    payload: dict[str, Any] = {
        "recommendation": recommendation.pk,
        "anomaly": anomaly.pk,
        "action": action,
        "excluded_nodes": [],
        "exclusion_sources": {},
        "reason": "test",
        "policy": "built-in defaults",
        "mode": workload.cluster.mode,
        "job_mode": "act",
        "would_have_done": would_have_done,
    }
    if in_action_scope is not None:
        payload["in_action_scope"] = in_action_scope
    record_event(
        cluster=workload.cluster,
        workload=workload,
        attempt=1,
        kind=AuditKind.RECOMMENDED,
        actor=Actor.POLICY,
        payload=payload,
        occurred_at=created_at,
    )
    if approved_after is not None:
        record_event(
            cluster=workload.cluster,
            workload=workload,
            attempt=1,
            kind=AuditKind.APPROVED,
            actor="otto",
            payload={"recommendation": recommendation.pk, "action": action, "note": ""},
            occurred_at=created_at + timedelta(seconds=approved_after),
        )
    return recommendation


def dispatched(recommendation: Recommendation, after: float, actor: str = "controller:c1") -> None:
    record_event(
        cluster=recommendation.workload.cluster,
        workload=recommendation.workload,
        attempt=1,
        kind=AuditKind.DISPATCHED,
        actor=actor,
        payload={
            "recommendation": recommendation.pk,
            "action": recommendation.action,
            "argv": ["scontrol", "requeuehold", recommendation.workload.job_id],
            "sequence": 1,
        },
        occurred_at=recommendation.created_at + timedelta(seconds=after),
    )


@pytest.fixture
def history() -> History:
    """A cluster with a canary (partition ``canary``) and the policy's recommendations of the
    last few days, one of each way a recommendation ends, plus two that must not count."""
    now = timezone.now()
    cluster = ClusterFactory(name="lab", action_partitions=["canary"])
    main, main_attempt = _workload(cluster, "gpu", ["gpu-001", "gpu-002"])
    canary, canary_attempt = _workload(cluster, "canary", [f"c-{i}" for i in range(4)])
    day = timedelta(days=1)
    made = {
        "approved_excluding": recommended(
            main,
            main_attempt,
            action=RecommendationAction.RESTART_EXCLUDING,
            status=RecommendationStatus.EXECUTED,
            created_at=now - 5 * day,
            approved_after=600,
            in_action_scope=False,
            disposition=Disposition.CONVERGED,
        ),
        "approved_restart": recommended(
            main,
            main_attempt,
            action=RecommendationAction.RESTART,
            status=RecommendationStatus.EXECUTED,
            category=FailureCategory.NCCL_TIMEOUT,
            created_at=now - 4 * day,
            approved_after=1200,
            in_action_scope=False,
        ),
        # Approved without decided_at: the approved event's time counts.
        "approved_stop": recommended(
            canary,
            canary_attempt,
            action=RecommendationAction.STOP,
            status=RecommendationStatus.READY,
            category=FailureCategory.APP_EXCEPTION,
            created_at=now - 3 * day,
            approved_after=1800,
            decided_at_stored=False,
            in_action_scope=True,
        ),
        "rejected_restart": recommended(
            main,
            main_attempt,
            action=RecommendationAction.RESTART,
            status=RecommendationStatus.REJECTED,
            category=FailureCategory.NCCL_TIMEOUT,
            created_at=now - 2 * day,
            rejected_after=300,
            in_action_scope=False,
        ),
        # An event from before the canary was recorded: the current setting places it.
        "awaiting_drain": recommended(
            main,
            None,
            action=RecommendationAction.DRAIN,
            status=RecommendationStatus.AWAITING_APPROVAL,
            created_at=now - day,
        ),
        "ready_by_policy": recommended(
            canary,
            canary_attempt,
            action=RecommendationAction.RESTART,
            status=RecommendationStatus.EXECUTED,
            created_at=now - 6 * day,
            would_have_done=False,
            in_action_scope=True,
            disposition=Disposition.CONVERGED,
        ),
        "expired_undecided": recommended(
            main,
            main_attempt,
            action=RecommendationAction.RESTART,
            status=RecommendationStatus.EXPIRED,
            created_at=now - 7 * day,
            in_action_scope=False,
        ),
        # Neither counts: replaced by a sharper one, and older than the window.
        "superseded": recommended(
            main,
            main_attempt,
            action=RecommendationAction.RESTART,
            status=RecommendationStatus.SUPERSEDED,
            created_at=now - 2 * day,
        ),
        "too_old": recommended(
            main,
            main_attempt,
            action=RecommendationAction.RESTART,
            status=RecommendationStatus.REJECTED,
            created_at=now - 40 * day,
            rejected_after=60,
        ),
    }
    dispatched(made["approved_excluding"], 700)
    dispatched(made["approved_excluding"], 900)  # a second command: the first one counts
    dispatched(made["ready_by_policy"], 60)
    # The watchdog's releases are dispatched for no recommendation.
    record_event(
        cluster=cluster,
        kind=AuditKind.DISPATCHED,
        actor=Actor.WATCHDOG,
        payload={"recommendation": None, "action": "watchdog_release", "argv": [], "sequence": 1},
        occurred_at=now - day,
    )
    return History(cluster, now, made)


def report_of(history: History, **kwargs: Any) -> Readiness:
    kwargs.setdefault("attribution", NO_PROVIDER)
    return readiness_of(history.cluster, now=history.now, **kwargs)


def checks(report: Readiness) -> dict[str, tuple[CheckState, str]]:
    return {item.key: (item.state, item.detail) for item in report.checklist}


def test_it_counts_each_recommendation_once_by_how_it_was_decided(history: History) -> None:
    counts = report_of(history).counts
    assert counts.recommended == 7
    assert counts.approved == 3
    assert counts.rejected == 1
    assert counts.expired == 1
    assert counts.awaiting == 1
    assert counts.ready_without_approval == 1
    assert counts.expired_unclaimed == 0
    assert counts.decided == 4


def test_the_window_defaults_to_thirty_days_and_can_be_narrowed(history: History) -> None:
    report = report_of(history)
    assert report.until == history.now
    assert report.since == history.now - timedelta(days=DEFAULT_DAYS)
    narrow = report_of(history, since=history.now - timedelta(days=3, hours=1))
    assert narrow.counts.recommended == 3  # the stop, the rejection and the drain


def test_time_to_approval_takes_decided_at_or_the_approved_event(history: History) -> None:
    time_to_approval = report_of(history).time_to_approval
    assert time_to_approval.count == 3
    assert time_to_approval.median == 1200
    assert time_to_approval.p95 == 1800


def test_the_wait_for_approval_costs_nodes_times_delay(history: History) -> None:
    """Two nodes waited 600 s and 1200 s, four nodes waited 1800 s: 1/3 + 2/3 + 2 node-hours."""
    cost = report_of(history).approval_cost
    assert cost.unit == "node-hours"
    assert "nodes of the attempt" in cost.size_counted_as
    assert cost.total == pytest.approx(3.0)
    assert cost.counted == 3
    assert cost.size_unknown == 0


def test_a_recommendation_without_an_attempt_is_sized_by_the_current_attempt(
    history: History,
) -> None:
    Recommendation.objects.filter(pk=history.by_name["approved_stop"].pk).update(attempt=None)
    assert report_of(history).approval_cost.total == pytest.approx(3.0)
    Attempt.objects.filter(workload=history.by_name["approved_stop"].workload).update(nodes=[])
    cost = report_of(history).approval_cost
    assert cost.total == pytest.approx(1.0)
    assert (cost.counted, cost.size_unknown) == (2, 1)


def test_agreement_is_per_action_and_per_category(history: History) -> None:
    report = report_of(history)
    by_action = {a.key: (a.approved, a.rejected, a.rate) for a in report.agreement_by_action}
    assert by_action == {
        "restart": (1, 1, 0.5),
        "restart_excluding": (1, 0, 1.0),
        "stop": (1, 0, 1.0),
    }
    by_category = {a.key: (a.approved, a.rejected) for a in report.agreement_by_category}
    assert by_category == {"nccl_timeout": (1, 1), "gpu_hardware": (1, 0), "app_exception": (1, 0)}
    assert report.agreement_by_category[0].key == "nccl_timeout"  # most decided first


def test_the_canary_and_the_rest_side_by_side(history: History) -> None:
    halves = {h.half: h for h in report_of(history).halves}
    canary, rest = halves[Half.CANARY], halves[Half.MONITOR]
    assert "partition canary" in canary.label
    assert (canary.recommended, canary.approved, canary.rejected) == (2, 1, 0)
    assert canary.carried_out_without_approval == 1
    assert (canary.to_dispatch.count, canary.to_dispatch.median) == (1, 60)
    assert (canary.converged, canary.abandoned) == (1, 0)
    assert (rest.recommended, rest.approved, rest.rejected) == (5, 2, 1)
    assert rest.carried_out_without_approval == 0
    assert (rest.to_dispatch.count, rest.to_dispatch.median) == (1, 700)
    assert rest.converged == 1


def test_the_halves_follow_the_events_once_the_canary_is_gone(history: History) -> None:
    """The canary was removed since: the events still say which jobs were in it."""
    Cluster.objects.filter(pk=history.cluster.pk).update(action_partitions=[])
    history.cluster.refresh_from_db()
    halves = {h.half: h for h in report_of(history).halves}
    assert "none now" in halves[Half.CANARY].label
    # The drain's event predates the canary: with no canary now, every job is in scope.
    assert halves[Half.CANARY].recommended == 3
    assert halves[Half.MONITOR].recommended == 4


def test_no_halves_without_a_canary_then_or_now() -> None:
    """Without a canary every job is in the part action mode reaches: nothing to compare."""
    cluster = ClusterFactory()
    workload, attempt = _workload(cluster, "gpu", ["gpu-001"])
    for in_scope in (None, True):
        recommended(
            workload,
            attempt,
            action=RecommendationAction.RESTART,
            status=RecommendationStatus.AWAITING_APPROVAL,
            created_at=timezone.now() - timedelta(hours=1),
            in_action_scope=in_scope,
        )
    report = readiness_of(cluster, attribution=NO_PROVIDER)
    assert report.counts.awaiting == 2
    assert report.halves == ()


def test_the_checklist_reads_the_stored_facts(history: History) -> None:
    found = checks(report_of(history))
    assert found["settings"][0] == CheckState.UNKNOWN
    assert found["scheduler"][0] == CheckState.ATTENTION  # never polled
    assert found["controller_tokens"][0] == CheckState.ATTENTION
    assert found["controller_seen"][0] == CheckState.ATTENTION
    assert found["canary"] == (CheckState.OK, found["canary"][1])
    assert "partition canary" in found["canary"][1]
    assert found["trial"][0] == CheckState.ATTENTION
    assert f"at least {MONITOR_TRIAL_DECISIONS}" in found["trial"][1]
    assert found["carried_out"][0] == CheckState.OK
    assert found["blast_radius"][0] == CheckState.ATTENTION  # built-in defaults
    assert found["stop_rules"][0] == CheckState.UNKNOWN
    assert found["drains"][0] == CheckState.OK  # off: every drain waits
    assert found["hooks"][0] == CheckState.ATTENTION
    assert found["attribution"][0] == CheckState.ATTENTION
    for by_hand in ("slurm_rights", "backups", "alerting", "on_call", "way_back"):
        assert found[by_hand][0] == CheckState.UNKNOWN, by_hand
        assert found[by_hand][1]


def test_checklist_items_turn_ok_on_their_facts(history: History) -> None:
    cluster, now = history.cluster, history.now
    Cluster.objects.filter(pk=cluster.pk).update(last_polled_at=now - timedelta(seconds=2))
    cluster.refresh_from_db()
    token, _ = ControllerToken.issue(cluster, "c1")
    ControllerToken.objects.filter(pk=token.pk).update(last_used_at=now - timedelta(minutes=1))
    ControllerToken.issue(ClusterFactory(name="other"), "elsewhere")
    record_event(
        cluster=cluster,
        kind=AuditKind.SCHEDULER_HOOK,
        actor="hook:slurmctld",
        payload={"source": "strigger", "event": "node_down", "key": "n", "state": "", "note": ""},
        occurred_at=now - timedelta(days=2),
    )
    Policy.objects.create(name="lab", cluster=cluster, blast_radius_percent=5)
    Policy.objects.create(name="lab-canary", cluster=cluster, partition="canary")
    Policy.objects.create(name="prod-env", environment="prod", blast_radius_percent=100)
    found = checks(report_of(history, attribution=PROVIDER_OK))
    assert found["scheduler"][0] == CheckState.OK
    assert found["controller_tokens"][0] == CheckState.OK
    assert (
        "c1" in found["controller_tokens"][1] and "elsewhere" not in found["controller_tokens"][1]
    )
    assert found["controller_seen"][0] == CheckState.OK
    assert found["hooks"][0] == CheckState.OK
    assert found["blast_radius"] == (CheckState.OK, found["blast_radius"][1])
    assert "Policy lab:" in found["blast_radius"][1] and "5 %" in found["blast_radius"][1]
    assert found["attribution"][0] == CheckState.OK
    if connection.vendor == "mysql":
        assert found["audit_triggers"][0] == CheckState.OK


def test_a_monitor_mode_trial_needs_enough_decisions() -> None:
    cluster = ClusterFactory()
    workload, attempt = _workload(cluster, "gpu", ["gpu-001"])
    start = timezone.now() - timedelta(days=2)
    for i in range(MONITOR_TRIAL_DECISIONS):
        recommended(
            workload,
            attempt,
            action=RecommendationAction.RESTART,
            status=RecommendationStatus.EXECUTED,
            created_at=start + timedelta(minutes=i),
            approved_after=60,
        )
    found = checks(readiness_of(cluster, attribution=NO_PROVIDER))
    assert found["trial"][0] == CheckState.OK


def test_failed_or_abandoned_approvals_need_attention(history: History) -> None:
    Recommendation.objects.filter(pk=history.by_name["approved_restart"].pk).update(
        disposition=Disposition.ABANDONED
    )
    state, detail = checks(report_of(history))["carried_out"]
    assert state == CheckState.ATTENTION
    assert "1 abandoned" in detail


def test_automatic_drains_before_any_drain_approved_by_hand_need_attention(
    history: History,
) -> None:
    Cluster.objects.filter(pk=history.cluster.pk).update(drain_automatically=True)
    history.cluster.refresh_from_db()
    assert checks(report_of(history))["drains"][0] == CheckState.ATTENTION
    Recommendation.objects.filter(pk=history.by_name["awaiting_drain"].pk).update(
        status=RecommendationStatus.READY, approved_by="otto"
    )
    assert checks(report_of(history))["drains"][0] == CheckState.OK


def test_attribution_degraded_in_the_window_needs_attention(history: History) -> None:
    record_event(
        cluster=history.cluster,
        kind=AuditKind.ATTRIBUTION_DEGRADED,
        actor=Actor.ATTRIBUTION,
        payload={"provider_host": "verdicts.example:8080", "reason": "timeout"},
        occurred_at=history.now - timedelta(days=1),
    )
    state, detail = checks(report_of(history, attribution=PROVIDER_OK))["attribution"]
    assert state == CheckState.ATTENTION
    assert "was unavailable" in detail


def test_nothing_is_ok_on_a_cluster_with_no_history() -> None:
    """A new cluster: only facts stored say ok (drains off, the audit triggers)."""
    cluster = ClusterFactory()
    report = readiness_of(cluster, attribution=NO_PROVIDER)
    assert report.counts.recommended == 0
    assert report.time_to_approval.count == 0 and report.time_to_approval.median is None
    ok = {item.key for item in report.checklist if item.state == CheckState.OK}
    assert ok <= {"drains", "audit_triggers"}


def test_the_queries_do_not_grow_with_the_history(
    history: History, django_assert_max_num_queries: DjangoAssertNumQueries
) -> None:
    with django_assert_max_num_queries(14):
        report_of(history)
    workload = history.by_name["approved_restart"].workload
    attempt = Attempt.objects.get(workload=workload, number=1)
    for i in range(15):
        created = history.now - timedelta(hours=i + 1)
        made = recommended(
            workload,
            attempt,
            action=RecommendationAction.RESTART,
            status=RecommendationStatus.EXECUTED,
            created_at=created,
            approved_after=30,
            decided_at_stored=i % 2 == 0,
        )
        dispatched(made, 40)
    with django_assert_max_num_queries(14):
        report = report_of(history)
    assert report.counts.approved == 18


@pytest.mark.parametrize(
    ("given", "days"), [(None, DEFAULT_DAYS), ("", DEFAULT_DAYS), ("1", 1), ("365", 365)]
)
def test_days_within_range_are_taken(given: str | None, days: int) -> None:
    assert parse_days(given) == days


@pytest.mark.parametrize("given", ["0", "366", "-1", "7.5", "abc", "1e3", "٣"])
def test_days_out_of_range_are_refused(given: str) -> None:
    with pytest.raises(DaysError):
        parse_days(given)
