"""Audit payloads: each kind's declared shape matches what the loop records, and the demo history
records nothing else."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from recovery.audit.payloads import PAYLOADS, payload_problems
from recovery.choices import AuditKind, ClusterMode, EvidenceSource, RecommendationStatus
from recovery.demo.fleet import seed_demo_cluster
from recovery.detection.findings import Finding
from recovery.loop import recommendations
from recovery.loop.anomalies import record_anomalies
from recovery.loop.poll import poll_cluster
from recovery.loop.watchdog import expire_stale_recommendations
from recovery.models import Attempt, AuditEvent, Recommendation, Workload
from tests.factories import ClusterFactory
from tests.fakes import SUBMITTED, Scripted, job, restated

pytestmark = pytest.mark.django_db

NOW = datetime(2025, 6, 3, 12, 0, tzinfo=UTC)


def problems_in_the_trail() -> list[tuple[int, str, list[str]]]:
    return [
        (event.pk, event.kind, found)
        for event in AuditEvent.objects.order_by("id")
        if (found := payload_problems(event.kind, event.payload))
    ]


def test_every_audit_kind_declares_its_payload() -> None:
    assert set(PAYLOADS) == {kind.value for kind in AuditKind}


def test_the_checker_names_what_is_wrong_with_a_payload() -> None:
    recommended = {
        "recommendation": 3,
        "anomaly": 2,
        "action": "restart",
        "excluded_nodes": [],
        "exclusion_sources": {},
        "reason": "crash; restart from the last checkpoint",
        "policy": "built-in defaults",
        "mode": "monitor",
        "job_mode": "act",
        "would_have_done": True,
    }
    assert payload_problems(AuditKind.RECOMMENDED, recommended) == []
    wrong = {**recommended, "excluded_nodes": "node001", "dispatched_at": "now"}
    del wrong["policy"]
    assert payload_problems(AuditKind.RECOMMENDED, wrong) == [
        "recommended: missing key 'policy'",
        "recommended: unexpected key 'dispatched_at'",
        "recommended: 'excluded_nodes' is str, expected list",
    ]
    assert payload_problems(AuditKind.RECOMMENDED, {**recommended, "recommendation": True}) == [
        "recommended: 'recommendation' is bool, expected int"
    ]
    assert payload_problems("stopped", {"recommendation": 3, "reason": "", "why": ""}) == [
        "stopped: missing key 'stop_reason'",
        "stopped: unexpected key 'why'",
    ]
    assert payload_problems("teleported", {}) == ["unknown audit kind 'teleported'"]


def test_optional_keys_may_be_left_out_but_not_mistyped() -> None:
    vanished = {"from": "running", "to": "unknown", "reason": "the scheduler no longer lists it"}
    assert payload_problems(AuditKind.STATE_CHANGED, vanished) == []
    assert payload_problems(AuditKind.STATE_CHANGED, {**vanished, "restart_count": "1"}) == [
        "state_changed: 'restart_count' is str, expected int"
    ]
    assert payload_problems(AuditKind.EXPIRED, {
        "recommendation": 1, "action": "restart", "expires_at": None, "reason": "late"
    }) == []  # fmt: skip


def test_the_loop_records_the_declared_payloads() -> None:
    """
    GIVEN a job the poller sees running
    WHEN its log shows an Xid, the scheduler reports it failed, an operator approves the
         restart, a controller claims and carries it out, the job runs again and completes;
         and a second recommendation is rejected and a third expires
    THEN every event the loop recorded on the way has the payload its kind declares
    """
    cluster = ClusterFactory(mode=ClusterMode.MONITOR)
    running = job()
    poll_cluster(cluster, Scripted([running]), ingest_logs=False)
    workload = Workload.objects.get()
    attempt = Attempt.objects.get()
    xid = Finding(
        kind="crash",
        category="gpu_hardware",
        attribution="hardware",
        severity="fatal",
        signature="xid-79",
        evidence="NVRM: Xid (PCI:0000:3b:00): 79, pid=2231, GPU has fallen off the bus.",
        nodes=["node002"],
        at=SUBMITTED + timedelta(minutes=1),
        detail={"role": "cause", "xid": 79},
    )
    record_anomalies(
        workload, attempt, [xid], SUBMITTED + timedelta(minutes=1), source=EvidenceSource.JOB_OUTPUT
    )
    ended = SUBMITTED + timedelta(minutes=1)
    failed = restated(running, "FAILED", exit_code=1, end_time=ended)
    poll_cluster(cluster, Scripted([failed]), ingest_logs=False)
    restart = Recommendation.objects.get(workload=workload)
    recommendations.approve(restart.pk, operator="operator", note="node002 is drained")
    recommendations.claim(restart.pk, controller="controller:c1", instance="i-1", lease_seconds=120)
    recommendations.report(
        restart.pk,
        controller="controller:c1",
        instance="i-1",
        result=recommendations.ActionReport(
            outcome="executed",
            state_before={"known": True, "job_state": "FAILED"},
            commands=[{"argv": ["scontrol", "requeuehold", running.job_id], "returncode": 0}],
            converged=True,
        ),
    )
    requeued = restated(failed, "PENDING", nodes=[], restart_count=1, exit_code=None)
    poll_cluster(cluster, Scripted([requeued]), ingest_logs=False)
    again = restated(requeued, "RUNNING", nodes=["node003"], excluded_nodes=["node002"])
    poll_cluster(cluster, Scripted([again]), ingest_logs=False)
    done = restated(again, "COMPLETED", exit_code=0)
    poll_cluster(cluster, Scripted([done]), ingest_logs=False)

    later = Recommendation.objects.create(
        workload=workload, action="restart", status=RecommendationStatus.AWAITING_APPROVAL,
        idempotency_key="later", expires_at=NOW,
    )  # fmt: skip
    recommendations.reject(later.pk, operator="operator", note="not now")
    Recommendation.objects.create(
        workload=workload, action="restart", status=RecommendationStatus.READY,
        idempotency_key="stale", expires_at=NOW,
    )  # fmt: skip
    expire_stale_recommendations(NOW + timedelta(minutes=1))

    kinds = set(AuditEvent.objects.values_list("kind", flat=True))
    assert {
        AuditKind.STATE_CHANGED,
        AuditKind.DETECTED,
        AuditKind.CONFIRMED,
        AuditKind.ATTRIBUTED,
        AuditKind.RECOMMENDED,
        AuditKind.APPROVED,
        AuditKind.CLAIMED,
        AuditKind.SCHEDULER_ACTION,
        AuditKind.RESTART_ALLOCATED,
        AuditKind.TRAINING_COMPLETED,
        AuditKind.REJECTED,
        AuditKind.EXPIRED,
    } <= kinds
    assert problems_in_the_trail() == []


def test_the_demo_history_records_what_the_loop_records() -> None:
    seed_demo_cluster(now=NOW)
    assert AuditEvent.objects.count() > 100
    assert problems_in_the_trail() == []
