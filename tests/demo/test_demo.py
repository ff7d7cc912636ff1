"""The demo seed: idempotent, coherent, and the demo users get the right roles."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management import call_command
from django.db import transaction

from recovery import roles
from recovery.choices import (
    AuditKind,
    ClusterMode,
    FailureCategory,
    RecommendationStatus,
    WorkloadState,
)
from recovery.demo.fleet import ensure_demo_users, seed_demo_cluster
from recovery.models import (
    Anomaly,
    Attempt,
    AuditEvent,
    Cluster,
    Node,
    Recommendation,
    Verdict,
    Workload,
)

NOW = datetime(2025, 6, 3, 12, 0, tzinfo=UTC)
MODELS = (Cluster, Node, Workload, Attempt, Anomaly, Verdict, Recommendation, AuditEvent)


def counts() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in MODELS}


@pytest.mark.django_db
def test_seeding_twice_creates_nothing_new() -> None:
    first = seed_demo_cluster(now=NOW)
    after_first = counts()
    assert first.clusters == 2
    assert first.nodes == 24
    assert first.workloads >= 15
    assert first.events == after_first["AuditEvent"] > 0
    assert first.anomalies == after_first["Anomaly"]
    assert first.recommendations == after_first["Recommendation"]

    second = seed_demo_cluster(now=NOW)
    assert second.total == 0
    assert counts() == after_first


@pytest.mark.django_db
def test_seeding_later_still_creates_nothing_new() -> None:
    seed_demo_cluster(now=NOW)
    after_first = counts()
    assert seed_demo_cluster().total == 0
    assert counts() == after_first


def fingerprint_of_demo_data() -> list[tuple[object, ...]]:
    anomalies = Anomaly.objects.filter(workload__cluster__name__startswith="demo-")
    events = AuditEvent.objects.filter(cluster__name__startswith="demo-")
    return [
        *anomalies.order_by("fingerprint", "detected_at").values_list("fingerprint", "detected_at"),
        *events.order_by("id").values_list("kind", "actor", "occurred_at"),
    ]


class Rollback(Exception):
    pass


def fresh_seed(seed: int) -> list[tuple[object, ...]]:
    """Seed inside a savepoint, read the result, and roll it back."""
    snapshot: list[tuple[object, ...]] = []
    with contextlib.suppress(Rollback), transaction.atomic():
        seed_demo_cluster(now=NOW, seed=seed)
        snapshot = fingerprint_of_demo_data()
        raise Rollback
    return snapshot


@pytest.mark.django_db
def test_the_same_seed_gives_the_same_data() -> None:
    first = fresh_seed(11)
    assert Cluster.objects.count() == 0
    assert fresh_seed(11) == first
    assert fresh_seed(12) != first


@pytest.mark.django_db
def test_clusters_and_modes() -> None:
    seed_demo_cluster(now=NOW)
    a100 = Cluster.objects.get(name="demo-a100")
    h100 = Cluster.objects.get(name="demo-h100")
    assert a100.mode == ClusterMode.MONITOR
    assert not a100.acts_automatically
    assert h100.mode == ClusterMode.ACTION
    assert h100.acts_automatically
    assert a100.nodes.count() == 16
    assert h100.nodes.count() == 8
    assert a100.nodes.filter(name="gpu-a100-007", scheduler_state="DRAINED").exists()
    assert 12 <= a100.workloads.count() <= 14
    assert h100.workloads.count() == 4


@pytest.mark.django_db
def test_approvals_page_has_work() -> None:
    seed_demo_cluster(now=NOW)
    awaiting = Recommendation.objects.filter(status=RecommendationStatus.AWAITING_APPROVAL)
    assert awaiting.filter(workload__cluster__name="demo-a100").count() >= 3
    statuses = set(Recommendation.objects.values_list("status", flat=True))
    assert {
        RecommendationStatus.EXECUTED,
        RecommendationStatus.REJECTED,
        RecommendationStatus.SUPERSEDED,
    } <= statuses
    superseded = Recommendation.objects.get(status=RecommendationStatus.SUPERSEDED)
    assert superseded.superseded_by is not None
    keys = list(Recommendation.objects.values_list("idempotency_key", flat=True))
    assert len(keys) == len(set(keys))
    # Made by the policy itself, one per failed attempt and version.
    assert all(key.startswith("policy:") for key in keys)


@pytest.mark.django_db
def test_attempts_match_current_attempt() -> None:
    seed_demo_cluster(now=NOW)
    for workload in Workload.objects.all():
        numbers = list(workload.attempts.order_by("number").values_list("number", flat=True))
        assert numbers == list(range(1, workload.current_attempt + 1)), workload
        running = workload.attempts.filter(ended_at__isnull=True)
        if workload.state == WorkloadState.RUNNING:
            assert [a.number for a in running] == [workload.current_attempt], workload
        else:
            assert not running.exists(), workload
        for attempt in workload.attempts.all():
            assert attempt.nodes, attempt
            assert not set(attempt.excluded_nodes) & set(attempt.nodes), attempt
            assert attempt.started_at is not None and attempt.started_at >= workload.submit_time
            if attempt.ended_at is not None:
                assert attempt.ended_at > attempt.started_at
        if workload.last_checkpoint_step is not None:
            assert workload.last_progress_step is not None
            assert workload.last_checkpoint_step <= workload.last_progress_step
            assert workload.last_checkpoint_at is not None
            assert workload.last_checkpoint_at <= NOW
        if workload.last_progress_at is not None:
            assert workload.submit_time < workload.last_progress_at <= NOW


@pytest.mark.django_db
def test_anomalies_are_well_formed() -> None:
    seed_demo_cluster(now=NOW)
    valid = {choice.value for choice in FailureCategory}
    anomalies = list(Anomaly.objects.select_related("attempt"))
    assert anomalies
    for anomaly in anomalies:
        assert anomaly.category in valid, anomaly
        assert anomaly.category != FailureCategory.HEALTHY
        assert anomaly.evidence_line and anomaly.evidence_line in anomaly.evidence_excerpt
        assert len(anomaly.evidence_excerpt.splitlines()) >= 3
        assert 0 < anomaly.detection_latency_seconds < 60
        assert anomaly.attempt is not None
        assert anomaly.verdicts.filter(provider="builtin").exists()
        latest = anomaly.verdicts.order_by("-created_at", "-id").first()
        assert latest is not None and latest.attribution == anomaly.attribution
    categories = {anomaly.category for anomaly in anomalies}
    assert len(categories) >= 10
    flood = Anomaly.objects.get(category=FailureCategory.NCCL_TIMEOUT)
    assert flood.occurrences == 63
    assert len(flood.implicated_ranks) == 63
    xid = Anomaly.objects.get(signature="xid_79_fallen_off_bus")
    assert "GPU has fallen off the bus" in xid.evidence_line
    assert xid.implicated_nodes == ["gpu-a100-007"]


@pytest.mark.django_db
def test_audit_trail_is_coherent() -> None:
    seed_demo_cluster(now=NOW)
    kinds = set(AuditEvent.objects.values_list("kind", flat=True))
    assert {
        AuditKind.STATE_CHANGED,
        AuditKind.DETECTED,
        AuditKind.ATTRIBUTED,
        AuditKind.RECOMMENDED,
        AuditKind.APPROVED,
        AuditKind.REJECTED,
        AuditKind.CONFIRMED,
        AuditKind.SUPERSEDED,
        AuditKind.CLAIMED,
        AuditKind.SCHEDULER_ACTION,
        AuditKind.ACTION_SKIPPED,
        AuditKind.WATCHDOG_RELEASED,
        AuditKind.EXPIRED,
        AuditKind.RESTART_ALLOCATED,
        AuditKind.PROGRESS_RESUMED,
        AuditKind.CHECKPOINT_SAVED,
        AuditKind.TRAINING_COMPLETED,
    } <= kinds
    assert not AuditEvent.objects.filter(occurred_at__gt=NOW).exists()
    for recommendation in Recommendation.objects.select_related("workload"):
        trail = AuditEvent.objects.filter(
            workload=recommendation.workload, payload__recommendation=recommendation.pk
        )
        assert trail.filter(kind=AuditKind.RECOMMENDED, actor="policy").exists()
        if recommendation.status == RecommendationStatus.EXECUTED:
            assert trail.filter(kind=AuditKind.SCHEDULER_ACTION).exists()
            if recommendation.workload.cluster.mode == ClusterMode.MONITOR:
                assert trail.filter(kind=AuditKind.APPROVED).exists()
    # Each workload's ids follow its times: the trail reads in order.
    for workload in Workload.objects.all():
        times = list(workload.audit_events.order_by("id").values_list("occurred_at", flat=True))
        assert times == sorted(times)


@pytest.mark.django_db
def test_seed_demo_command_prints_the_summary() -> None:
    out = StringIO()
    call_command("seed_demo", stdout=out)
    assert "created 2 clusters" in out.getvalue()
    out = StringIO()
    call_command("seed_demo", stdout=out)
    assert "nothing created" in out.getvalue()


@pytest.fixture
def role_groups(db: None) -> None:
    """The groups the migration makes: a transactional test that ran before in the same worker
    emptied them."""
    roles.sync_roles(Group, Permission)


@pytest.mark.usefixtures("role_groups")
def test_demo_users_get_their_roles() -> None:
    usernames = ensure_demo_users("first-Secret-42")
    assert usernames == ["operator", "viewer", "admin"]
    user_model = get_user_model()
    operator = user_model.objects.get(username="operator")
    viewer = user_model.objects.get(username="viewer")
    admin = user_model.objects.get(username="admin")
    assert list(operator.groups.values_list("name", flat=True)) == [roles.OPERATOR]
    assert list(viewer.groups.values_list("name", flat=True)) == [roles.VIEWER]
    assert list(admin.groups.values_list("name", flat=True)) == [roles.ADMIN]
    assert operator.has_perm(roles.DECIDE_PERMISSION)
    assert not viewer.has_perm(roles.DECIDE_PERMISSION)
    assert admin.has_perm(roles.DECIDE_PERMISSION)
    assert admin.is_staff and not admin.is_superuser
    assert not operator.is_staff and not viewer.is_staff

    ensure_demo_users("second-Secret-42")
    operator = user_model.objects.get(username="operator")
    assert operator.check_password("second-Secret-42")
    assert not operator.check_password("first-Secret-42")
    assert user_model.objects.filter(username__in=usernames).count() == 3


@pytest.mark.usefixtures("role_groups")
def test_create_demo_users_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEMO_PASSWORD", raising=False)
    out = StringIO()
    call_command("create_demo_users", stdout=out)
    text = out.getvalue()
    line = next(
        line for line in text.splitlines() if line.startswith("Demo password (operator, viewer")
    )
    password = line.split(": ", 1)[1]
    assert get_user_model().objects.get(username="viewer").check_password(password)
    assert "/accounts/login/" in text

    monkeypatch.setenv("DEMO_PASSWORD", "from-the-Env-42")
    out = StringIO()
    call_command("create_demo_users", stdout=out)
    assert "from-the-Env-42" not in out.getvalue()
    assert get_user_model().objects.get(username="operator").check_password("from-the-Env-42")

    call_command("create_demo_users", password="from-the-Option-42", stdout=StringIO())
    assert get_user_model().objects.get(username="admin").check_password("from-the-Option-42")
