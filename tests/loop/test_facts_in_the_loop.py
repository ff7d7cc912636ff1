"""Scheduler states, node states and progress become anomalies; the policy waits for causes.

The scheduler here is scripted; tests/slurm and tests/e2e run the same code on real Slurm.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models import QuerySet
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from recovery.choices import (
    NODE_ACTIONS,
    AnomalyKind,
    AuditKind,
    ClusterMode,
    Confirmation,
    EvidenceSource,
    RecommendationAction,
    RecommendationStatus,
    StragglerAction,
    WorkloadState,
)
from recovery.detection.findings import Finding
from recovery.loop.anomalies import record_anomalies
from recovery.loop.confirmation import ReadContext, last_sample_id
from recovery.loop.monitors import check_progress, check_suspects
from recovery.loop.policy import decide_pending
from recovery.loop.poll import poll_cluster
from recovery.models import (
    Anomaly,
    Attempt,
    AuditEvent,
    Cluster,
    Node,
    Policy,
    ProgressSample,
    Recommendation,
    Workload,
)
from recovery.schedulers.base import JobInfo, NodeInfo
from tests.factories import AttemptFactory, ClusterFactory, RecommendationFactory, WorkloadFactory
from tests.fakes import Scripted, job, restated

pytestmark = pytest.mark.django_db

NODES = ["node001", "node002", "node003"]


def healthy(*flagged: NodeInfo) -> list[NodeInfo]:
    named = {node.name: node for node in flagged}
    return [named.get(name, NodeInfo(name, "ALLOCATED")) for name in NODES]


def symptom(node: str = "node001") -> Finding:
    return Finding(
        kind="crash",
        category="nccl_error",
        attribution="unknown",
        severity="fatal",
        signature="peer-connection-lost",
        evidence="RuntimeError: [pair.cc:534] Connection closed by peer [127.0.0.1]:45678",
        nodes=[node],
        ranks=[0],
        detail={"role": "symptom"},
    )


def xid_79(node: str) -> Finding:
    return Finding(
        kind="crash",
        category="gpu_hardware",
        attribution="hardware",
        severity="fatal",
        signature="xid-79",
        evidence="NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
        nodes=[node],
        detail={"role": "cause", "xid": 79},
    )


def app_exception(evidence: str) -> Finding:
    return Finding(
        kind="crash",
        category="app_exception",
        attribution="application",
        severity="fatal",
        signature="python-exception",
        evidence=evidence,
        detail={"role": "cause"},
    )


# The rest of a read that saw the process end: what confirms a crash the job printed.
DIED = ReadContext(
    exits=[
        Finding(
            kind="crash",
            category="scheduler_event",
            attribution="unknown",
            severity="error",
            signature="srun-task-exited",
            evidence="srun: error: node001: task 0: Exited with exit code 1",
            detail={"role": "wrapper", "reports_exit": True},
        )
    ]
)


def job_recommendations() -> QuerySet[Recommendation]:
    """Restarts and stops: a node a site fact blames is also recommended for a drain."""
    return Recommendation.objects.exclude(action__in=NODE_ACTIONS)


@pytest.fixture
def acting_cluster() -> Cluster:
    cluster = ClusterFactory(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True)
    Policy.objects.create(name="lab", cluster=cluster, blast_radius_percent=100)
    return cluster


def running_workload(
    cluster: Cluster, nodes: Sequence[str] = NODES
) -> tuple[JobInfo, Workload, Attempt]:
    running = job(nodes=list(nodes))
    poll_cluster(cluster, Scripted([running], healthy()))
    return running, Workload.objects.get(cluster=cluster), Attempt.objects.get()


def test_a_symptom_waits_and_a_node_that_stops_responding_supplies_the_cause(
    acting_cluster: Cluster,
) -> None:
    running, workload, attempt = running_workload(acting_cluster)
    record_anomalies(
        workload, attempt, [symptom()], timezone.now(), source=EvidenceSource.JOB_OUTPUT
    )
    assert not job_recommendations().exists()

    lost = NodeInfo("node002", "ALLOCATED", flags=["NOT_RESPONDING"])
    poll_cluster(acting_cluster, Scripted([running], healthy(lost)))

    recommendation = job_recommendations().get()
    assert recommendation.action == RecommendationAction.RESTART_EXCLUDING
    assert recommendation.excluded_nodes == ["node002"]
    assert recommendation.anomaly is not None
    assert recommendation.anomaly.attribution == "hardware"
    assert not Anomaly.objects.filter(decided_at__isnull=True).exists()
    assert Node.objects.get(name="node002").health == "unhealthy"
    drain = Recommendation.objects.get(action=RecommendationAction.DRAIN)
    assert drain.node is not None and drain.node.name == "node002"
    # Even in acknowledged action mode a drain waits for a person unless the cluster says not.
    assert drain.status == RecommendationStatus.AWAITING_APPROVAL


def test_a_node_not_responding_under_a_healthy_job_is_not_a_failure(
    acting_cluster: Cluster,
) -> None:
    running, _, _ = running_workload(acting_cluster)
    lost = NodeInfo("node002", "ALLOCATED", flags=["NOT_RESPONDING"])
    poll_cluster(acting_cluster, Scripted([running], healthy(lost)))
    assert not Anomaly.objects.exists()


def test_a_node_going_down_under_a_running_job_is_a_failure_on_that_node(
    acting_cluster: Cluster,
) -> None:
    running, _, _ = running_workload(acting_cluster)
    down = NodeInfo("node003", "DOWN", flags=["NOT_RESPONDING"], reason="Not responding")
    poll_cluster(acting_cluster, Scripted([running], healthy(down)))
    poll_cluster(acting_cluster, Scripted([running], healthy(down)))
    anomaly = Anomaly.objects.get()
    assert (anomaly.category, anomaly.attribution) == ("scheduler_event", "hardware")
    assert anomaly.implicated_nodes == ["node003"]
    assert job_recommendations().get().excluded_nodes == ["node003"]


def test_an_operator_draining_a_node_under_a_running_job_changes_nothing(
    acting_cluster: Cluster,
) -> None:
    running, _, _ = running_workload(acting_cluster)
    drained = NodeInfo("node001", "MIXED", flags=["DRAIN"], reason="kernel upgrade")
    poll_cluster(acting_cluster, Scripted([running], healthy(drained)))
    assert not Anomaly.objects.exists()


def test_silence_after_a_lost_peer_waits_for_the_node_that_went_down(
    acting_cluster: Cluster,
) -> None:
    """
    GIVEN a rank that lost its peer, then no progress for the confirmation window (a stall)
    WHEN the peer's node is marked down and the job ends NODE_FAIL some seconds later
    THEN the restart excludes that node: the stall's hang waited for its cause
    """
    _, workload, attempt = running_workload(acting_cluster)
    lost_at = timezone.now()
    ProgressSample.objects.bulk_create(
        ProgressSample(workload=workload, attempt=attempt.number, step=step, at=at)
        for step, at in ((40, lost_at - timedelta(seconds=2)), (41, lost_at - timedelta(seconds=1)))
    )
    seen = ReadContext(samples_after=last_sample_id(workload))
    record_anomalies(
        workload, attempt, [symptom()], lost_at, read=seen, source=EvidenceSource.JOB_OUTPUT
    )
    (hang,) = check_suspects(acting_cluster, lost_at + timedelta(seconds=11))
    assert hang.kind == AnomalyKind.HANG
    assert decide_pending(acting_cluster, lost_at + timedelta(seconds=11)) == 0
    assert not job_recommendations().exists()

    down = NodeInfo("node002", "DOWN", flags=["NOT_RESPONDING"], reason="Not responding")
    ended = job(nodes=NODES, state="NODE_FAIL", reason="NodeDown", end_time=timezone.now())
    poll_cluster(acting_cluster, Scripted([ended], healthy(down)))

    recommendation = job_recommendations().get()
    assert recommendation.action == RecommendationAction.RESTART_EXCLUDING
    assert recommendation.excluded_nodes == ["node002"]
    assert Anomaly.objects.get(pk=hang.pk).decided_at is not None


def test_a_symptom_is_decided_once_the_attempt_ends(acting_cluster: Cluster) -> None:
    _, workload, attempt = running_workload(acting_cluster)
    record_anomalies(
        workload, attempt, [symptom()], timezone.now(), source=EvidenceSource.JOB_OUTPUT
    )
    failed = job(nodes=NODES, state="FAILED", exit_code=1, end_time=timezone.now())
    poll_cluster(acting_cluster, Scripted([failed], healthy()))

    recommendation = job_recommendations().get()
    assert recommendation.action == RecommendationAction.RESTART
    # The logs explained the failure: no second anomaly for the bare FAILED state.
    assert Anomaly.objects.count() == 1


def test_a_symptom_is_decided_when_the_grace_period_runs_out(acting_cluster: Cluster) -> None:
    _, workload, attempt = running_workload(acting_cluster)
    now = timezone.now()
    record_anomalies(
        workload, attempt, [symptom()], now, read=DIED, source=EvidenceSource.JOB_OUTPUT
    )
    assert decide_pending(acting_cluster, now + timedelta(seconds=29)) == 0
    assert decide_pending(acting_cluster, now + timedelta(seconds=31)) == 1
    assert job_recommendations().get().action == RecommendationAction.RESTART


def test_a_cause_is_decided_at_once_and_a_later_symptom_never_changes_it(
    acting_cluster: Cluster,
) -> None:
    _, workload, attempt = running_workload(acting_cluster)
    xid = xid_79("node002")
    now = timezone.now()
    record_anomalies(workload, attempt, [xid], now, read=DIED, source=EvidenceSource.JOB_OUTPUT)
    record_anomalies(
        workload, attempt, [symptom()], now, read=DIED, source=EvidenceSource.JOB_OUTPUT
    )
    decide_pending(acting_cluster, now + timedelta(minutes=5))
    recommendation = job_recommendations().get()
    assert recommendation.excluded_nodes == ["node002"]


def test_a_bare_failed_state_is_an_anomaly_when_the_logs_said_nothing(
    acting_cluster: Cluster,
) -> None:
    running_workload(acting_cluster)
    failed = job(nodes=NODES, state="FAILED", exit_code=3, end_time=timezone.now())
    poll_cluster(acting_cluster, Scripted([failed], healthy()))
    poll_cluster(acting_cluster, Scripted([failed], healthy()))
    anomaly = Anomaly.objects.get()
    assert anomaly.details["role"] == "wrapper"
    assert anomaly.details["source"] == "scheduler"
    assert job_recommendations().get().action == RecommendationAction.RESTART


def test_node_fail_implicates_the_node_that_went_down(acting_cluster: Cluster) -> None:
    running_workload(acting_cluster)
    down = NodeInfo("node002", "DOWN", flags=["NOT_RESPONDING"], reason="Not responding")
    ended = job(nodes=NODES, state="NODE_FAIL", reason="NodeDown", end_time=timezone.now())
    poll_cluster(acting_cluster, Scripted([ended], healthy(down)))
    implicated = {tuple(a.implicated_nodes) for a in Anomaly.objects.all()}
    assert implicated == {("node002",)}
    assert job_recommendations().get().excluded_nodes == ["node002"]


def progress(
    workload: Workload,
    attempt: Attempt,
    *,
    start: datetime,
    seconds: float,
    every: float = 5.0,
    nodes: Sequence[str] = NODES,
    slow: str | None = None,
    slow_from: datetime | None = None,
) -> None:
    samples = []
    count = int(seconds / every)
    for index in range(count):
        at = start + timedelta(seconds=index * every)
        for rank, node in enumerate(nodes):
            slowed = node == slow and (slow_from is None or at >= slow_from)
            rate = 500.0 if slowed else 1000.0
            samples.append(
                ProgressSample(
                    workload=workload,
                    attempt=attempt.number,
                    rank=rank,
                    node=node,
                    step=index,
                    throughput=rate,
                    at=at,
                )
            )
    ProgressSample.objects.bulk_create(samples)


def test_no_progress_past_the_policy_timeout_is_a_hang_dated_when_it_became_one() -> None:
    cluster = ClusterFactory(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True)
    Policy.objects.create(name="fast hangs", cluster=cluster, hang_timeout_minutes=1)
    now = timezone.now()
    workload = WorkloadFactory(cluster=cluster)
    attempt = AttemptFactory(workload=workload, started_at=now - timedelta(minutes=10))
    progress(workload, attempt, start=now - timedelta(minutes=9), seconds=300)
    last = now - timedelta(minutes=9) + timedelta(seconds=295)

    assert check_progress(workload, last + timedelta(seconds=50)) == []
    (hang,) = check_progress(workload, now)
    assert hang.kind == AnomalyKind.HANG
    assert abs((hang.evidence_at - (last + timedelta(seconds=60))).total_seconds()) < 1
    assert check_progress(workload, now + timedelta(seconds=5)) == []  # recorded once
    assert job_recommendations().get().action == RecommendationAction.RESTART


@pytest.mark.parametrize("action", [StragglerAction.RECORD, StragglerAction.RESTART_EXCLUDING])
def test_a_node_slower_than_its_peers_is_a_straggler(action: str) -> None:
    cluster = ClusterFactory(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True)
    Policy.objects.create(
        name="stragglers",
        cluster=cluster,
        straggler_window_minutes=1,
        straggler_action=action,
        blast_radius_percent=100,
    )
    now = timezone.now()
    workload = WorkloadFactory(cluster=cluster)
    attempt = AttemptFactory(workload=workload, nodes=NODES, started_at=now - timedelta(minutes=5))
    progress(
        workload,
        attempt,
        start=now - timedelta(seconds=200),
        seconds=200,
        slow="node003",
        slow_from=now - timedelta(seconds=50),
    )

    (straggler,) = check_progress(workload, now)
    assert straggler.kind == AnomalyKind.STRAGGLER
    assert straggler.implicated_nodes == ["node003"]
    if action == StragglerAction.RECORD:
        assert not job_recommendations().exists()
    else:
        assert job_recommendations().get().excluded_nodes == ["node003"]


def test_a_node_behind_failures_of_several_workloads_is_flagged_suspect_once() -> None:
    cluster = ClusterFactory()
    Node.objects.create(cluster=cluster, name="gpu-009")
    Policy.objects.create(name="suspects", cluster=cluster, suspect_node_workloads=3)
    xid = Finding(
        kind="crash",
        category="gpu_hardware",
        attribution="hardware",
        severity="fatal",
        signature="xid-48",
        evidence="NVRM: Xid (PCI:0000:3b:00): 48, An uncorrectable double bit error",
        nodes=["gpu-009"],
        detail={"role": "cause", "xid": 48},
    )
    now = timezone.now()
    for index in range(4):
        workload = WorkloadFactory(cluster=cluster)
        attempt = AttemptFactory(workload=workload)
        # The node's own kernel log: a site fact (what jobs print cannot flag a node).
        record_anomalies(
            workload,
            attempt,
            [xid],
            now,
            read=DIED,
            scope="kernel:gpu-009",
            source=EvidenceSource.KERNEL_LOG,
        )
        flagged = Node.objects.get(name="gpu-009").suspect_since is not None
        assert flagged == (index >= 2)
    assert AuditEvent.objects.filter(kind=AuditKind.NODE_SUSPECT).count() == 1
    assert "3 workloads" in Node.objects.get(name="gpu-009").suspect_reason


def test_a_broken_policy_engine_loses_no_anomaly_and_says_so_once(
    acting_cluster: Cluster,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, workload, attempt = running_workload(acting_cluster)

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("policy engine exploded")

    monkeypatch.setattr("recovery.loop.policy_rules.decide", broken)
    cause = app_exception("KeyError: 'input_ids'")
    now = timezone.now()
    record_anomalies(workload, attempt, [cause], now, read=DIED, source=EvidenceSource.JOB_OUTPUT)
    decide_pending(acting_cluster, now + timedelta(seconds=40))
    anomaly = Anomaly.objects.get()
    assert anomaly.decided_at is None
    assert anomaly.details["policy_tries"] == 2
    (event,) = AuditEvent.objects.filter(kind=AuditKind.POLICY_FAILED)
    assert "policy engine exploded" in event.payload["error"]

    monkeypatch.undo()
    decide_pending(acting_cluster, now + timedelta(seconds=80))
    assert job_recommendations().get().action == RecommendationAction.RESTART


def test_an_attempt_already_acted_on_gets_no_second_action(acting_cluster: Cluster) -> None:
    _, workload, attempt = running_workload(acting_cluster)
    now = timezone.now()
    first = app_exception("ValueError: bad batch")
    record_anomalies(workload, attempt, [first], now, read=DIED, source=EvidenceSource.JOB_OUTPUT)
    job_recommendations().update(status="executed")
    later = xid_79("node003")
    record_anomalies(workload, attempt, [later], now, read=DIED, source=EvidenceSource.JOB_OUTPUT)
    assert job_recommendations().count() == 1
    # ... but the node stays out of the next attempt's restart.
    Workload.objects.filter(pk=workload.pk).update(current_attempt=2, state=WorkloadState.RUNNING)
    second = AttemptFactory(workload=workload, number=2)
    record_anomalies(
        Workload.objects.get(pk=workload.pk),
        second,
        [first],
        now,
        read=DIED,
        source=EvidenceSource.JOB_OUTPUT,
    )
    assert job_recommendations().latest("id").excluded_nodes == ["node003"]


LAUNCH_FAILURE = "RuntimeError: CUDA error: unspecified launch failure"


def cuda_error(signature: str, evidence: str) -> Finding:
    """A CUDA error rank 1 printed, naming no node, attributed to the application."""
    return Finding(
        kind="crash",
        category="cuda_error_app",
        attribution="application",
        severity="fatal",
        signature=signature,
        evidence=evidence,
        nodes=[],
        ranks=[1],
        detail={"role": "cause"},
    )


def test_a_cuda_error_on_a_node_that_showed_an_xid_is_that_nodes_hardware(
    acting_cluster: Cluster,
) -> None:
    _, workload, attempt = running_workload(acting_cluster)
    xid = xid_79("node002")
    cuda = cuda_error("cuda-runtime-error", LAUNCH_FAILURE)
    now = timezone.now()
    record_anomalies(workload, attempt, [xid], now, read=DIED, source=EvidenceSource.JOB_OUTPUT)
    (anomaly,) = record_anomalies(
        workload, attempt, [cuda], now, read=DIED, source=EvidenceSource.JOB_OUTPUT
    )
    assert (anomaly.attribution, anomaly.implicated_nodes) == ("hardware", ["node002"])
    verdict = anomaly.verdicts.get()
    assert "xid-79" in verdict.detail["rule"]
    assert job_recommendations().get().excluded_nodes == ["node002"]


def test_hardware_evidence_the_job_survived_explains_no_later_cuda_error(
    acting_cluster: Cluster,
) -> None:
    """
    GIVEN an Xid on node002 printed in the job's output, which the job trained on after
    WHEN a CUDA error ends the attempt later
    THEN the CUDA error keeps its own attribution: the node is not blamed for it
    """
    _, workload, attempt = running_workload(acting_cluster)
    now = timezone.now()
    (earlier,) = record_anomalies(
        workload, attempt, [xid_79("node002")], now, source=EvidenceSource.JOB_OUTPUT
    )
    Anomaly.objects.filter(pk=earlier.pk).update(confirmation="survived")
    cuda = cuda_error("cuda-error-kernel", LAUNCH_FAILURE)
    (anomaly,) = record_anomalies(
        workload, attempt, [cuda], now, read=DIED, source=EvidenceSource.JOB_OUTPUT
    )
    assert (anomaly.attribution, anomaly.implicated_nodes) == ("application", [])


def test_a_device_side_assert_stays_the_programs_beside_an_xid(acting_cluster: Cluster) -> None:
    _, workload, attempt = running_workload(acting_cluster)
    now = timezone.now()
    record_anomalies(
        workload, attempt, [xid_79("node002")], now, read=DIED, source=EvidenceSource.JOB_OUTPUT
    )
    assertion = cuda_error(
        "cuda-device-assert", "RuntimeError: CUDA error: device-side assert triggered"
    )
    (anomaly,) = record_anomalies(
        workload, attempt, [assertion], now, read=DIED, source=EvidenceSource.JOB_OUTPUT
    )
    assert (anomaly.attribution, anomaly.implicated_nodes) == ("application", [])


def test_an_application_exception_stays_the_applications_beside_an_xid(
    acting_cluster: Cluster,
) -> None:
    _, workload, attempt = running_workload(acting_cluster)
    xid = xid_79("node002")
    bug = app_exception("KeyError: 'input_ids'")
    now = timezone.now()
    record_anomalies(workload, attempt, [xid], now, source=EvidenceSource.JOB_OUTPUT)
    (anomaly,) = record_anomalies(workload, attempt, [bug], now, source=EvidenceSource.JOB_OUTPUT)
    assert anomaly.attribution == "application"


def test_slurms_notice_of_our_own_requeue_is_not_a_new_failure(
    acting_cluster: Cluster,
) -> None:
    from recovery.audit.record import record_event
    from recovery.loop.anomalies import record_findings
    from recovery.loop.logs import scan

    _, workload, attempt = running_workload(acting_cluster)
    line = (
        b"slurmstepd-node001: error: *** JOB 4242 ON node001 CANCELLED AT "
        b"2026-11-29T18:28:24 DUE TO JOB REQUEUE ***\n"
    )
    result = scan(line)
    assert result.findings  # without the restart in the trail it would be an anomaly
    record_event(
        cluster=acting_cluster,
        workload=workload,
        kind=AuditKind.SCHEDULER_ACTION,
        actor="controller:test",
        payload={"action": "restart"},
    )
    assert (
        record_findings(workload, attempt, result, timezone.now(), source=EvidenceSource.JOB_OUTPUT)
        == 0
    )
    assert not Anomaly.objects.exists()


def test_a_symptom_followed_by_more_training_is_no_failure(acting_cluster: Cluster) -> None:
    _, workload, attempt = running_workload(acting_cluster)
    now = timezone.now()
    ProgressSample.objects.create(workload=workload, attempt=1, step=119, at=now)
    (anomaly,) = record_anomalies(
        workload, attempt, [symptom()], now, source=EvidenceSource.JOB_OUTPUT
    )
    assert anomaly.confirmation == Confirmation.SUSPECTED
    for step in (120, 121):
        ProgressSample.objects.create(workload=workload, attempt=1, step=step, at=now)
    check_suspects(acting_cluster, now + timedelta(seconds=2))
    decide_pending(acting_cluster, now + timedelta(seconds=5))
    anomaly.refresh_from_db()
    assert anomaly.confirmation == Confirmation.SURVIVED
    assert anomaly.decided_at is not None
    assert not job_recommendations().exists()


def test_a_job_younger_than_the_straggler_window_is_not_judged_yet() -> None:
    cluster = ClusterFactory()
    Policy.objects.create(name="stragglers", cluster=cluster, straggler_window_minutes=1)
    now = timezone.now()
    workload = WorkloadFactory(cluster=cluster)
    attempt = AttemptFactory(workload=workload, nodes=NODES, started_at=now - timedelta(minutes=1))
    progress(
        workload,
        attempt,
        start=now - timedelta(seconds=40),
        seconds=40,
        slow="node003",
        slow_from=now - timedelta(seconds=30),
    )
    assert check_progress(workload, now) == []


def test_a_node_failure_read_after_the_job_runs_elsewhere_belongs_to_the_old_attempt(
    acting_cluster: Cluster,
) -> None:
    _, workload, first = running_workload(acting_cluster)
    second = AttemptFactory(workload=workload, number=2, nodes=["node004", "node005"])
    Workload.objects.filter(pk=workload.pk).update(current_attempt=2)
    failure = Finding(
        kind="crash",
        category="scheduler_event",
        attribution="hardware",
        severity="fatal",
        signature="slurm-node-failure",
        evidence="*** JOB 4242 ON node002 CANCELLED AT 2026-11-29T19:37:27 DUE TO NODE FAILURE ***",
        nodes=["node002"],
        detail={"role": "cause"},
    )
    (anomaly,) = record_anomalies(
        Workload.objects.get(pk=workload.pk),
        second,
        [failure],
        timezone.now(),
        source=EvidenceSource.JOB_OUTPUT,
    )
    assert anomaly.attempt == first


def test_a_requeued_job_still_completing_lends_its_old_nodes_to_no_new_attempt(
    acting_cluster: Cluster,
) -> None:
    running, _, _ = running_workload(acting_cluster)
    completing = restated(running, "COMPLETING", restart_count=1)
    poll_cluster(acting_cluster, Scripted([completing], healthy()))
    second = Attempt.objects.get(number=2)
    assert (second.nodes, second.started_at) == ([], None)


def excluded_count(facts: dict[str, Any]) -> int:
    """How many nodes other jobs' restarts excluded within the day, as the facts count them."""
    return sum(count for _, count in facts["excluded_by_minute"])


# How the blast facts' read of other jobs' exclusions starts in SQL.
EXCLUSIONS_READ = "`excluded_nodes`) AS `length` FROM `recovery_recommendation`"


@pytest.fixture
def no_exclusions_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process has read no cluster's exclusions yet: an earlier test's read of a cluster
    with the same id (ids start again after a flush) would be checked, found stale and read
    again, which is right but reads twice."""
    monkeypatch.setattr("recovery.loop.exclusions_read._exclusions_read", {})


def test_the_anomalies_of_one_read_share_the_blast_facts_read_once(
    acting_cluster: Cluster, no_exclusions_read: None
) -> None:
    """
    GIVEN another job's restart that excluded node009, and one restart that excluded nothing
    WHEN one read brings two hardware failures of this job, each decided
    THEN both decisions hold the same blast facts (node009 once, the cluster's size), read from
         the database once for the read; the restart that excluded nothing is not read at all
    """
    _, workload, attempt = running_workload(acting_cluster)
    other = WorkloadFactory(cluster=acting_cluster, job_id="other-job")
    RecommendationFactory(workload=other, excluded_nodes=["node009"])
    RecommendationFactory(workload=other, action=RecommendationAction.RESTART, excluded_nodes=[])
    second = replace(xid_79("node003"), signature="xid-48", detail={"role": "cause", "xid": 48})
    with CaptureQueriesContext(connection) as queries:
        created = record_anomalies(
            workload, attempt, [xid_79("node002"), second], timezone.now(),
            read=DIED, source=EvidenceSource.JOB_OUTPUT,
        )  # fmt: skip
    assert len(created) == 2
    blast = [
        {
            key: anomaly.decision_facts[key]
            for key in ("cluster_size", "excluded_by_minute", "excluded_at")
        }
        for anomaly in Anomaly.objects.filter(pk__in=[a.pk for a in created])
    ]
    assert blast[0] == blast[1]
    assert blast[0]["cluster_size"] == len(NODES)
    # node009, counted within the last minute; named by neither decision, so not by name
    assert blast[0]["excluded_by_minute"] == [[1, 1]]
    assert blast[0]["excluded_at"] == {}
    exclusion_reads = [
        q["sql"] for q in queries if EXCLUSIONS_READ in q["sql"] and "`created_at` >=" in q["sql"]
    ]
    assert len(exclusion_reads) == 1


def test_a_later_decision_reuses_the_exclusions_read_until_another_restart_changes_them(
    acting_cluster: Cluster, no_exclusions_read: None
) -> None:
    """
    GIVEN another job's restart that excluded node009, read by a decision on this job
    WHEN two later reads each bring a failure: the first with nothing new, the second after a
         third job's restart excluded node010
    THEN each later decision reads only the restarts recorded since the one before (this
         job's own restart, then node010's), never every row again, and the last counts node010
         beside node009
    """
    _, workload, attempt = running_workload(acting_cluster)
    other = WorkloadFactory(cluster=acting_cluster, job_id="other-job")
    third = WorkloadFactory(cluster=acting_cluster, job_id="third-job")
    RecommendationFactory(workload=other, excluded_nodes=["node009"])

    def decide(signature: str) -> tuple[int, list[str]]:
        finding = replace(xid_79("node002"), signature=signature)
        with CaptureQueriesContext(connection) as queries:
            (created,) = record_anomalies(
                workload, attempt, [finding], timezone.now(),
                read=DIED, source=EvidenceSource.JOB_OUTPUT,
            )  # fmt: skip
        created.refresh_from_db()
        row_reads = [
            "since" if "`id` >" in q["sql"] else "all"
            for q in queries
            if EXCLUSIONS_READ in q["sql"]
        ]
        return excluded_count(created.decision_facts), row_reads

    assert decide("xid-79") == (1, ["all"])
    assert decide("xid-48") == (1, ["since"])
    RecommendationFactory(workload=third, excluded_nodes=["node010"])
    assert decide("xid-94") == (2, ["since"])


def test_a_finding_another_worker_stored_meanwhile_is_not_stored_twice(
    acting_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """
    GIVEN a finding already stored by another worker after this read looked for it
    WHEN this read records it
    THEN the unique constraint turns the insert into the stored anomaly: one row, none created
    """
    _, workload, attempt = running_workload(acting_cluster)
    now = timezone.now()
    (first,) = record_anomalies(
        workload, attempt, [xid_79("node002")], now, read=DIED, source=EvidenceSource.JOB_OUTPUT
    )
    monkeypatch.setattr("recovery.loop.anomalies._stored", lambda workload, fingerprints: {})
    again = record_anomalies(
        workload, attempt, [xid_79("node002")], now, read=DIED, source=EvidenceSource.JOB_OUTPUT
    )
    assert again == []
    assert list(Anomaly.objects.values_list("pk", flat=True)) == [first.pk]


@pytest.mark.parametrize(
    ("recorded_before_s", "reads_wanted"),
    [(0, ["since", "recent"]), (600, ["since", "recent", "all"])],
    ids=["recorded-with-the-newest", "recorded-long-before"],
)
def test_a_stale_read_of_a_clusters_exclusions_is_never_used(
    acting_cluster: Cluster,
    no_exclusions_read: None,
    recorded_before_s: int,
    reads_wanted: list[str],
) -> None:
    """
    GIVEN this process's read of the cluster's exclusions (node009), and then a restart of
          another job excluding node011 that commits under a lower id than one already read
          (as a transaction that took its id first and committed last does)
    WHEN a decision gathers its facts
    THEN the rows recorded since are not enough to account for the window: the minutes before
         the newest kept restart are read again, and when the late one is older still (its
         transaction lasted longer than the slack) every row; node011 is counted either way
    """
    _, workload, attempt = running_workload(acting_cluster)
    other = WorkloadFactory(cluster=acting_cluster, job_id="other-job")
    late = RecommendationFactory(workload=other, excluded_nodes=["node011"])
    late_pk = late.pk
    late.delete()
    RecommendationFactory(workload=other, excluded_nodes=["node009"])
    now = timezone.now()
    (first,) = record_anomalies(
        workload, attempt, [xid_79("node002")], now, read=DIED, source=EvidenceSource.JOB_OUTPUT
    )
    assert excluded_count(first.decision_facts) == 1
    RecommendationFactory(
        pk=late_pk, workload=other, excluded_nodes=["node011"],
        created_at=now - timedelta(seconds=recorded_before_s),
    )  # fmt: skip
    with CaptureQueriesContext(connection) as queries:
        (second,) = record_anomalies(
            workload, attempt, [replace(xid_79("node002"), signature="xid-48")],
            timezone.now(), read=DIED, source=EvidenceSource.JOB_OUTPUT,
        )  # fmt: skip
    reads = [
        "since"
        if "`id` >" in q["sql"]
        else "recent"
        if q["sql"].count("`created_at` >=") == 2
        else "all"
        for q in queries
        if EXCLUSIONS_READ in q["sql"]
    ]
    assert reads == reads_wanted
    # node009 and node011; this job's own restart (node002) is never among them.
    assert excluded_count(second.decision_facts) == 2
    assert second.decision_facts["excluded_at"] == {}


def test_a_finding_seen_again_is_matched_without_reading_the_facts_decided_on(
    acting_cluster: Cluster,
) -> None:
    """
    GIVEN an anomaly decided, its facts stored
    WHEN a later read brings the same finding again
    THEN the read that matches it by fingerprint leaves the facts out (tens of kilobytes each
         on a busy cluster), and they are still there
    """
    _, workload, attempt = running_workload(acting_cluster)
    (first,) = record_anomalies(
        workload, attempt, [xid_79("node002")], timezone.now(),
        read=DIED, source=EvidenceSource.JOB_OUTPUT,
    )  # fmt: skip
    first.refresh_from_db()
    assert first.decision_facts
    with CaptureQueriesContext(connection) as queries:
        again = record_anomalies(
            workload, attempt, [xid_79("node002")], timezone.now(),
            read=DIED, source=EvidenceSource.JOB_OUTPUT,
        )  # fmt: skip
    assert again == []
    matches = [q["sql"] for q in queries if "`fingerprint` IN" in q["sql"]]
    assert matches and all("decision_facts" not in sql for sql in matches)
    first.refresh_from_db()
    assert first.decision_facts
