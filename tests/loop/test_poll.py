"""Polling turns scheduler state into workloads, attempts and audit events, once."""

from __future__ import annotations

from datetime import timedelta

import pytest

from recovery.choices import AttemptExitState, AuditKind, Connection, WorkloadState
from recovery.loop.poll import adapter_for, poll_cluster
from recovery.models import Attempt, AuditEvent, Node, Workload
from recovery.schedulers.base import NodeInfo, SchedulerError
from tests.factories import ClusterFactory
from tests.fakes import SUBMITTED, Scripted, job, restated

pytestmark = pytest.mark.django_db


def test_it_creates_a_workload_and_its_first_attempt() -> None:
    cluster = ClusterFactory(environment="lab")
    summary = poll_cluster(cluster, Scripted([job()], [NodeInfo("node001", "MIXED")]))
    workload = Workload.objects.get()
    assert (summary.jobs_seen, summary.workloads_created, summary.state_changes) == (1, 1, 1)
    assert workload.state == WorkloadState.RUNNING
    assert workload.opted_in and workload.opt_in_mode == "act"
    assert workload.environment == "prod"
    attempt = Attempt.objects.get()
    assert (attempt.number, attempt.nodes) == (1, ["node001", "node002"])
    assert Node.objects.get().scheduler_state == "MIXED"
    assert AuditEvent.objects.get().kind == AuditKind.STATE_CHANGED


def test_polling_the_same_state_again_records_nothing() -> None:
    cluster = ClusterFactory()
    scheduler = Scripted([job()])
    poll_cluster(cluster, scheduler)
    summary = poll_cluster(cluster, scheduler)
    assert summary.state_changes == 0
    assert AuditEvent.objects.count() == 1


def test_a_requeue_starts_a_new_attempt_and_keeps_the_old_nodes() -> None:
    """
    GIVEN a running job polled on node001-002
    WHEN Slurm requeues it (node list cleared, submit time reset) and it starts on node003
    THEN attempt 1 keeps its nodes and ends as requeued; attempt 2 runs on node003
    """
    cluster = ClusterFactory()
    poll_cluster(cluster, Scripted([job()]))
    requeued = job(state="PENDING", reason="BeginTime", nodes=[], restart_count=1,
                   submit_time=SUBMITTED + timedelta(minutes=9))  # fmt: skip
    poll_cluster(cluster, Scripted([requeued]))
    running = restated(
        requeued,
        "RUNNING",
        nodes=["node003"],
        excluded_nodes=["node002"],
        start_time=SUBMITTED + timedelta(minutes=10),
    )
    poll_cluster(cluster, Scripted([running]))

    workload = Workload.objects.get()
    assert workload.current_attempt == 2
    assert workload.submit_time == SUBMITTED  # the first submission, not Slurm's reset one
    first, second = Attempt.objects.order_by("number")
    assert first.nodes == ["node001", "node002"]
    assert first.exit_state == AttemptExitState.REQUEUED
    assert first.ended_at is not None
    assert second.nodes == ["node003"]
    assert second.excluded_nodes == ["node002"]
    kinds = list(AuditEvent.objects.values_list("kind", flat=True))
    assert kinds == [
        AuditKind.STATE_CHANGED,  # running
        AuditKind.STATE_CHANGED,  # requeued
        AuditKind.STATE_CHANGED,  # running again
        AuditKind.RESTART_ALLOCATED,
    ]


def test_an_allocation_still_completing_after_a_requeue_is_not_the_new_attempts() -> None:
    """Slurm moves the start time at a requeue while the old allocation is still completing:
    the new attempt has not started, and a node of the old one is not its node."""
    cluster = ClusterFactory()
    poll_cluster(cluster, Scripted([job()]))
    completing = job(state="COMPLETING", restart_count=1,
                     submit_time=SUBMITTED + timedelta(minutes=9),
                     start_time=SUBMITTED + timedelta(minutes=9))  # fmt: skip
    poll_cluster(cluster, Scripted([completing]))
    second = Attempt.objects.get(number=2)
    assert (second.nodes, second.started_at) == ([], None)
    running = restated(completing, "RUNNING", nodes=["node003"],
                      start_time=SUBMITTED + timedelta(minutes=10))  # fmt: skip
    poll_cluster(cluster, Scripted([running]))
    second.refresh_from_db()
    assert second.nodes == ["node003"]
    assert second.started_at == SUBMITTED + timedelta(minutes=10)


def test_attempts_slurm_ran_and_requeued_between_two_polls_are_recorded_and_counted() -> None:
    """
    GIVEN a running job polled at its first attempt
    WHEN Slurm requeues it twice on its own before the next poll (restart count 0 -> 2)
    THEN attempt 2 exists, requeued, with no nodes or start time the scheduler no longer
         tells; attempt 3 runs; the retry budget counts three attempts
    """
    from recovery.loop.policy import history_of

    cluster = ClusterFactory()
    poll_cluster(cluster, Scripted([job()]))
    again = job(restart_count=2, nodes=["node005"], submit_time=SUBMITTED + timedelta(minutes=9),
                start_time=SUBMITTED + timedelta(minutes=10))  # fmt: skip
    poll_cluster(cluster, Scripted([again]))
    poll_cluster(cluster, Scripted([again]))

    first, unseen, current = Attempt.objects.order_by("number")
    assert [a.number for a in (first, unseen, current)] == [1, 2, 3]
    assert first.nodes == ["node001", "node002"]
    assert (unseen.nodes, unseen.started_at, unseen.exit_state) == (
        [],
        None,
        AttemptExitState.REQUEUED,
    )
    assert unseen.ended_at is not None
    assert current.nodes == ["node005"]
    assert history_of(Workload.objects.get()).attempts == 3


def test_an_unseen_attempt_still_completing_lends_its_nodes_to_that_attempt() -> None:
    """Slurm started and requeued attempt 2 between two polls; the poll finds its allocation
    still COMPLETING with the count already raised: those nodes are attempt 2's, not 3's."""
    cluster = ClusterFactory()
    poll_cluster(cluster, Scripted([job()]))
    completing = job(state="COMPLETING", restart_count=2, nodes=["node007", "node008"],
                     submit_time=SUBMITTED + timedelta(minutes=9),
                     start_time=SUBMITTED + timedelta(minutes=9))  # fmt: skip
    poll_cluster(cluster, Scripted([completing]))
    unseen, current = Attempt.objects.filter(number__gt=1).order_by("number")
    assert (unseen.number, unseen.nodes, unseen.started_at) == (2, ["node007", "node008"], None)
    assert (current.number, current.nodes, current.started_at) == (3, [], None)


def test_an_attempt_first_seen_after_it_ended_keeps_the_nodes_slurm_still_lists() -> None:
    """Found by the chaos run: attempt 2 started and failed between two polls. Slurm still
    listed its nodes, but only a running attempt's were kept; with none, the previous
    attempt's node failure read in the same output could not be told from this one's."""
    cluster = ClusterFactory()
    poll_cluster(cluster, Scripted([job()]))
    failed = job(state="FAILED", restart_count=1, nodes=["node003", "node004"], exit_code=1,
                 submit_time=SUBMITTED + timedelta(minutes=9),
                 start_time=SUBMITTED + timedelta(minutes=10),
                 end_time=SUBMITTED + timedelta(minutes=11))  # fmt: skip
    poll_cluster(cluster, Scripted([failed]))
    second = Attempt.objects.get(number=2)
    assert second.nodes == ["node003", "node004"]
    assert second.exit_state == AttemptExitState.FAILED


def test_a_job_first_seen_after_slurm_restarted_it_has_its_earlier_attempts_recorded() -> None:
    cluster = ClusterFactory()
    poll_cluster(cluster, Scripted([job(restart_count=2)]))
    attempts = Attempt.objects.order_by("number")
    assert [(a.number, a.exit_state, a.nodes) for a in attempts] == [
        (1, AttemptExitState.REQUEUED, []),
        (2, AttemptExitState.REQUEUED, []),
        (3, AttemptExitState.RUNNING, ["node001", "node002"]),
    ]
    assert all(a.ended_at is not None for a in attempts[:2])


def test_only_the_newest_unseen_attempts_are_recorded() -> None:
    from recovery.loop.poll_jobs import UNSEEN_ATTEMPTS_RECORDED

    cluster = ClusterFactory()
    poll_cluster(cluster, Scripted([job(restart_count=UNSEEN_ATTEMPTS_RECORDED + 10)]))
    numbers = list(Attempt.objects.order_by("number").values_list("number", flat=True))
    assert numbers == list(range(11, UNSEEN_ATTEMPTS_RECORDED + 12))


def test_a_reused_job_id_is_a_new_workload() -> None:
    cluster = ClusterFactory()
    poll_cluster(cluster, Scripted([job(state="COMPLETED")]))
    poll_cluster(cluster, Scripted([job(submit_time=SUBMITTED + timedelta(days=40))]))
    assert Workload.objects.count() == 2
    old, new = Workload.objects.order_by("submit_time")
    assert old.state == WorkloadState.COMPLETED
    assert new.state == WorkloadState.RUNNING


def test_a_completed_job_is_recorded_as_training_completed_once() -> None:
    cluster = ClusterFactory()
    done = job(state="COMPLETED", exit_code=0, end_time=SUBMITTED + timedelta(hours=1))
    poll_cluster(cluster, Scripted([done]))
    poll_cluster(cluster, Scripted([done]))
    assert AuditEvent.objects.filter(kind=AuditKind.TRAINING_COMPLETED).count() == 1
    assert Attempt.objects.get().exit_state == AttemptExitState.COMPLETED


def test_jobs_without_an_opt_in_key_are_not_stored_and_malformed_ones_are() -> None:
    cluster = ClusterFactory()
    jobs = [
        job(job_id="1", comment=""),
        job(job_id="2", comment="just a note"),
        job(job_id="3", comment='{"nvidia-recovery": {"mode": "sometimes"}}'),
    ]
    poll_cluster(cluster, Scripted(jobs))
    workload = Workload.objects.get()
    assert workload.job_id == "3"
    assert not workload.opted_in
    assert "mode must be observe or act" in workload.opt_in_error


def test_a_held_job_is_held() -> None:
    cluster = ClusterFactory()
    poll_cluster(cluster, Scripted([job(state="PENDING", held=True, nodes=[], restart_count=1)]))
    assert Workload.objects.get().state == WorkloadState.HELD


def test_incomplete_ssh_settings_are_explained() -> None:
    cluster = ClusterFactory(connection=Connection.SSH, connection_settings={"host": "login1"})
    with pytest.raises(SchedulerError, match="SSH settings incomplete"):
        adapter_for(cluster)


def test_a_job_the_scheduler_forgot_is_no_longer_running() -> None:
    cluster = ClusterFactory()
    poll_cluster(cluster, Scripted([job()]))
    poll_cluster(cluster, Scripted([]))
    poll_cluster(cluster, Scripted([]))
    workload = Workload.objects.get()
    assert workload.state == WorkloadState.UNKNOWN
    event = AuditEvent.objects.filter(kind=AuditKind.STATE_CHANGED).last()
    assert event is not None and event.payload["to"] == WorkloadState.UNKNOWN
    assert AuditEvent.objects.filter(kind=AuditKind.STATE_CHANGED).count() == 2


def test_a_job_listed_with_the_same_facts_is_not_synced_again() -> None:
    """
    GIVEN a job synced once
    WHEN the scheduler lists it again with every fact the same, then with one changed
    THEN the second poll writes nothing and reads nothing of it but its digest; the third
         syncs it, as a cluster's setting the sync reads does when it changes
    """
    cluster = ClusterFactory(environment="lab")
    poll_cluster(cluster, Scripted([job(comment='{"nvidia-recovery":{"mode":"act"}}')]))
    assert Workload.objects.get().environment == "lab"
    again = poll_cluster(cluster, Scripted([job(comment='{"nvidia-recovery":{"mode":"act"}}')]))
    assert (again.jobs_seen, again.unchanged) == (1, 1)
    assert again.workload_ids == [Workload.objects.get().pk]

    cluster.environment = "prod"
    cluster.save()
    changed = poll_cluster(cluster, Scripted([job(comment='{"nvidia-recovery":{"mode":"act"}}')]))
    assert changed.unchanged == 0
    assert Workload.objects.get().environment == "prod"


def test_an_ending_waits_on_its_attempt_until_the_workloads_are_processed() -> None:
    """The snapshot alone (the task's half) keeps the scheduler's word on an ended attempt;
    processing the workload judges it, once."""
    from recovery.loop.workloads import process_workloads
    from recovery.models import Anomaly

    cluster = ClusterFactory()
    poll_cluster(cluster, Scripted([job()]), workloads=False)
    ended = job(state="NODE_FAIL", reason="NodeFail", end_time=SUBMITTED + timedelta(hours=1))
    summary = poll_cluster(cluster, Scripted([ended]), workloads=False)
    attempt = Attempt.objects.get()
    assert attempt.ending_to_judge is not None
    assert attempt.ending_to_judge["state"] == "NODE_FAIL"
    assert not Anomaly.objects.exists()

    process_workloads(cluster, summary.workload_ids, None)
    assert Attempt.objects.get().ending_to_judge is None
    assert Anomaly.objects.get().details["state"] == "NODE_FAIL"
    process_workloads(cluster, summary.workload_ids, None)
    assert Anomaly.objects.count() == 1
