"""Workflows: which one a job joins, and the budget and exclusions its jobs share."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from recovery.choices import (
    AnomalyKind,
    AttemptExitState,
    Attribution,
    FailureCategory,
    RecommendationAction,
    StopReason,
)
from recovery.loop.policy import history_of, recommend
from recovery.loop.policy_rules import EARLIER_ATTEMPT
from recovery.loop.poll import poll_cluster
from recovery.loop.workflows import workflow_budget, workflow_of
from recovery.models import Policy, Workflow, Workload
from tests.factories import AnomalyFactory, AttemptFactory, ClusterFactory, WorkloadFactory
from tests.fakes import SUBMITTED, Scripted, job, restated

pytestmark = pytest.mark.django_db

IN_PRETRAIN = '{"nvidia-recovery":{"mode":"act","workflow":"pretrain"}}'


def test_a_job_naming_a_workflow_joins_its_owners_workflow_of_that_name() -> None:
    cluster = ClusterFactory()
    first = job(job_id="100", comment=IN_PRETRAIN)
    second = job(job_id="101", comment=IN_PRETRAIN, submit_time=SUBMITTED + timedelta(minutes=1))
    poll_cluster(cluster, Scripted([first, second]))
    workflow = Workflow.objects.get()
    assert (workflow.cluster, workflow.user, workflow.name) == (cluster, "alice", "pretrain")
    assert set(workflow.workloads.values_list("job_id", flat=True)) == {"100", "101"}


def test_two_users_naming_the_same_workflow_have_two_workflows() -> None:
    cluster = ClusterFactory()
    alice = job(job_id="100", comment=IN_PRETRAIN)
    mallory = job(job_id="101", user="mallory", comment=IN_PRETRAIN)
    poll_cluster(cluster, Scripted([alice, mallory]))
    owners = dict(Workload.objects.values_list("job_id", "workflow__user"))
    assert owners == {"100": "alice", "101": "mallory"}
    assert Workflow.objects.count() == 2


def test_the_same_name_on_another_cluster_is_another_workflow() -> None:
    poll_cluster(ClusterFactory(), Scripted([job(job_id="100", comment=IN_PRETRAIN)]))
    poll_cluster(ClusterFactory(), Scripted([job(job_id="100", comment=IN_PRETRAIN)]))
    assert Workflow.objects.count() == 2


def test_a_bad_workflow_name_leaves_the_job_opted_in_in_no_workflow_and_says_why() -> None:
    cluster = ClusterFactory()
    comment = '{"nvidia-recovery":{"mode":"act","workflow":"../etc"}}'
    poll_cluster(cluster, Scripted([job(comment=comment)]))
    workload = Workload.objects.get()
    assert workload.opted_in and workload.workflow is None
    assert workload.workflow_ignored.startswith("workflow '../etc' starts with '.'")
    assert not Workflow.objects.exists()


def test_a_job_that_depended_on_an_earlier_job_of_its_owner_starts_a_chain_with_it() -> None:
    cluster = ClusterFactory()
    first = WorkloadFactory(cluster=cluster, job_id="100", submit_time=SUBMITTED)
    second = WorkloadFactory(
        cluster=cluster, job_id="101", submit_time=SUBMITTED + timedelta(minutes=1),
        depends_on=["100"],
    )  # fmt: skip
    chain = workflow_of(second, "")
    assert chain is not None
    assert chain.name == f"chain-100-{SUBMITTED:%Y%m%d%H%M%S}"
    first.refresh_from_db()
    assert first.workflow == chain
    # A third job after the second joins the same chain.
    second.workflow = chain
    second.save()
    third = WorkloadFactory(
        cluster=cluster, job_id="102", submit_time=SUBMITTED + timedelta(minutes=2),
        depends_on=["101"],
    )  # fmt: skip
    assert workflow_of(third, "") == chain


def test_a_chains_first_job_stays_in_the_chain_when_synced_again() -> None:
    cluster = ClusterFactory()
    poll_cluster(cluster, Scripted([job(job_id="100")]))
    first = Workload.objects.get(job_id="100")
    chain = Workflow.objects.create(cluster=cluster, user="alice", name="chain-100")
    Workload.objects.filter(pk=first.pk).update(workflow=chain)
    poll_cluster(cluster, Scripted([job(job_id="100", state="COMPLETED")]))
    first.refresh_from_db()
    assert first.workflow == chain


def test_a_dependency_on_a_workflow_job_joins_that_workflow_and_a_named_one_wins() -> None:
    cluster = ClusterFactory()
    named = Workflow.objects.create(cluster=cluster, user="alice", name="pretrain")
    WorkloadFactory(cluster=cluster, job_id="100", submit_time=SUBMITTED, workflow=named)
    later = WorkloadFactory(
        cluster=cluster, job_id="101", submit_time=SUBMITTED + timedelta(minutes=1),
        depends_on=["100"],
    )  # fmt: skip
    assert workflow_of(later, "") == named
    other = workflow_of(later, "finetune")
    assert other is not None and other.name == "finetune"


def test_a_dependency_on_another_users_job_joins_nothing() -> None:
    cluster = ClusterFactory()
    theirs = Workflow.objects.create(cluster=cluster, user="bob", name="pretrain")
    WorkloadFactory(cluster=cluster, job_id="100", user="bob", workflow=theirs)
    mine = WorkloadFactory(cluster=cluster, job_id="101", user="alice", depends_on=["100"])
    assert workflow_of(mine, "") is None
    assert Workflow.objects.count() == 1


def _workflow_of_two_jobs() -> tuple[Workload, Workload]:
    """Job A ran twice and failed on gpu-002 (hardware); job B, of the same workflow, runs."""
    cluster = ClusterFactory()
    workflow = Workflow.objects.create(cluster=cluster, user="alice", name="pretrain")
    first = WorkloadFactory(cluster=cluster, workflow=workflow, submit_time=SUBMITTED)
    AttemptFactory(workload=first, number=1, nodes=["gpu-001", "gpu-002"])
    AttemptFactory(workload=first, number=2, nodes=["gpu-001", "gpu-003"],
                   excluded_nodes=["gpu-002"])  # fmt: skip
    AnomalyFactory(workload=first, implicated_nodes=["gpu-002"])
    second = WorkloadFactory(
        cluster=cluster, workflow=workflow, submit_time=SUBMITTED + timedelta(minutes=5)
    )
    AttemptFactory(workload=second, number=1, nodes=["gpu-001", "gpu-004"])
    return first, second


def test_the_attempts_and_exclusions_of_a_workflows_earlier_jobs_carry_to_the_next() -> None:
    first, second = _workflow_of_two_jobs()
    history = history_of(second, Policy())
    assert history.attempts == 3
    assert history.attempts_without_checkpoint == 3
    assert history.previously_excluded == {"gpu-002"}
    # The earlier job does not count the later one.
    assert history_of(first, Policy()).attempts == 2


def test_the_workflow_history_takes_the_same_queries_as_one_job() -> None:
    _, second = _workflow_of_two_jobs()
    alone = WorkloadFactory()
    AttemptFactory(workload=alone)
    with CaptureQueriesContext(connection) as own:
        history_of(alone, Policy())
    with CaptureQueriesContext(connection) as shared:
        history_of(second, Policy())
    assert len(shared) == len(own)


def test_a_checkpoint_in_an_earlier_job_ends_the_run_without_one() -> None:
    first, second = _workflow_of_two_jobs()
    first.attempts.filter(number=2).update(produced_checkpoint=True)
    assert history_of(second, Policy()).attempts_without_checkpoint == 1


def test_another_users_jobs_never_count() -> None:
    _, second = _workflow_of_two_jobs()
    theirs = Workflow.objects.create(cluster=second.cluster, user="bob", name="pretrain")
    bob = WorkloadFactory(cluster=second.cluster, user="bob", workflow=theirs,
                          submit_time=SUBMITTED)  # fmt: skip
    AttemptFactory(workload=bob, number=1, excluded_nodes=["gpu-009"])
    AnomalyFactory(workload=bob, implicated_nodes=["gpu-010"])
    history = history_of(second, Policy())
    assert history.attempts == 3
    assert history.previously_excluded == {"gpu-002"}


def test_the_next_jobs_restart_keeps_the_earlier_jobs_node_out_as_an_earlier_attempt() -> None:
    first, second = _workflow_of_two_jobs()
    first.attempts.filter(number=2).update(produced_checkpoint=True)
    failure = AnomalyFactory(
        workload=second,
        attempt=second.attempts.get(),
        kind=AnomalyKind.CRASH,
        category=FailureCategory.NCCL_TIMEOUT,
        attribution=Attribution.UNKNOWN,
        implicated_nodes=[],
    )
    recommendation = recommend(failure)
    assert recommendation is not None
    assert recommendation.action == RecommendationAction.RESTART_EXCLUDING
    assert recommendation.excluded_nodes == ["gpu-002"]
    assert recommendation.exclusion_sources == {"gpu-002": EARLIER_ATTEMPT}


def test_the_next_jobs_failure_stops_when_the_workflows_budget_is_spent() -> None:
    _, second = _workflow_of_two_jobs()
    Policy.objects.create(name="three attempts", max_attempts=3)
    failure = AnomalyFactory(workload=second, attempt=second.attempts.get())
    recommendation = recommend(failure)
    assert recommendation is not None
    assert recommendation.action == RecommendationAction.STOP
    assert recommendation.stop_reason == StopReason.RETRY_BUDGET
    assert recommendation.reason.endswith("after 3 attempts over 2 jobs of its workflow")


def test_a_chain_of_jobs_ending_at_their_time_limit_spends_no_retry_budget() -> None:
    """Day-long jobs continued by the next at the time limit: the next crash is a restart."""
    cluster = ClusterFactory()
    workflow = Workflow.objects.create(cluster=cluster, user="alice", name="pretrain-70b")
    for day in range(3):
        job = WorkloadFactory(
            cluster=cluster, workflow=workflow, submit_time=SUBMITTED + timedelta(days=day)
        )
        AttemptFactory(
            workload=job,
            number=1,
            exit_state=AttemptExitState.TIMEOUT,
            produced_checkpoint=True,
            excluded_nodes=["gpu-002"] if day == 0 else [],
        )
    today = WorkloadFactory(
        cluster=cluster, workflow=workflow, submit_time=SUBMITTED + timedelta(days=3)
    )
    Policy.objects.create(name="two attempts", max_attempts=2)
    failure = AnomalyFactory(workload=today, attempt=AttemptFactory(workload=today, number=1))
    history = history_of(today, Policy(max_attempts=2))
    assert (history.attempts, history.jobs) == (1, 1)
    # What earlier jobs kept out still carries over.
    assert history.previously_excluded == {"gpu-002"}
    recommendation = recommend(failure)
    assert recommendation is not None
    assert recommendation.action == RecommendationAction.RESTART_EXCLUDING


def test_a_crash_after_the_chain_went_on_still_counts_the_jobs_own_retries() -> None:
    first, second = _workflow_of_two_jobs()
    first.attempts.filter(number=2).update(exit_state=AttemptExitState.TIMEOUT)
    AttemptFactory(workload=second, number=2)
    assert history_of(second, Policy()).attempts == 2


def test_the_budget_of_a_workflow_is_counted_at_its_newest_job() -> None:
    _, second = _workflow_of_two_jobs()
    Policy.objects.create(name="five attempts", max_attempts=5)
    assert second.workflow is not None
    budget = workflow_budget(second.workflow)
    assert budget is not None
    assert (budget.attempts, budget.max_attempts, budget.attempts_left) == (3, 5, 2)
    assert budget.excluded_nodes == ["gpu-002"]
    assert budget.policy == "five attempts"


def test_a_workflow_without_jobs_has_no_budget() -> None:
    workflow = Workflow.objects.create(cluster=ClusterFactory(), user="alice", name="empty")
    assert workflow_budget(workflow) is None


def test_a_job_seen_waiting_on_an_earlier_job_of_a_workflow_joins_it_for_good() -> None:
    """
    GIVEN a job of the workflow "pretrain", and a job submitted with --dependency=afterany on it
    WHEN the second job is polled while it waits, then again once Slurm forgot the dependency
    THEN it joined the first job's workflow, and keeps it and the dependency recorded
    """
    cluster = ClusterFactory()
    first = job(job_id="100", comment=IN_PRETRAIN)
    waiting = job(job_id="101", state="PENDING", reason="Dependency", nodes=[],
                  submit_time=SUBMITTED + timedelta(minutes=1), chained_after=("100",))  # fmt: skip
    poll_cluster(cluster, Scripted([first, waiting]))
    poll_cluster(cluster, Scripted([first, restated(waiting, "RUNNING", chained_after=())]))
    second = Workload.objects.get(job_id="101")
    assert second.depends_on == ["100"]
    assert second.workflow is not None and second.workflow.name == "pretrain"


def test_a_chain_of_jobs_without_a_name_is_one_workflow() -> None:
    cluster = ClusterFactory()
    first = job(job_id="100")
    second = job(job_id="101", state="PENDING", nodes=[], chained_after=("100",),
                 submit_time=SUBMITTED + timedelta(minutes=1))  # fmt: skip
    third = job(job_id="102", state="PENDING", nodes=[], chained_after=("101",),
                submit_time=SUBMITTED + timedelta(minutes=2))  # fmt: skip
    poll_cluster(cluster, Scripted([first, second]))
    poll_cluster(cluster, Scripted([first, second, third]))
    workflow = Workflow.objects.get()
    assert workflow.name == f"chain-100-{SUBMITTED:%Y%m%d%H%M%S}"
    assert set(workflow.workloads.values_list("job_id", flat=True)) == {"100", "101", "102"}


def test_an_unreadable_dependency_joins_nothing_and_forgets_nothing() -> None:
    cluster = ClusterFactory()
    first = job(job_id="100")
    second = job(job_id="101", state="PENDING", nodes=[], chained_after=("100",),
                 submit_time=SUBMITTED + timedelta(minutes=1))  # fmt: skip
    poll_cluster(cluster, Scripted([first, second]))
    poll_cluster(cluster, Scripted([first, replace(second, chained_after=None, reason="x")]))
    assert Workload.objects.get(job_id="101").depends_on == ["100"]
    lone = job(job_id="103", state="PENDING", nodes=[], chained_after=None)
    poll_cluster(cluster, Scripted([lone]))
    assert Workload.objects.get(job_id="103").workflow is None
