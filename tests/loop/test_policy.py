"""The policy engine: decisions from anomaly, history and policy; one recommendation per failure."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from django.utils import timezone

from recovery.choices import (
    AnomalyKind,
    AuditKind,
    ClusterMode,
    ClusterNodeState,
    OptInMode,
    RecommendationAction,
    RecommendationStatus,
    StopReason,
    StragglerAction,
)
from recovery.loop.decision_facts import History
from recovery.loop.policy import (
    SitePolicy,
    history_of,
    policies_read_once,
    policy_for,
    recommend,
    site_policy,
    site_policy_for,
)
from recovery.loop.policy_rules import decide
from recovery.loop.poll import poll_cluster
from recovery.loop.recommendations import approve
from recovery.models import (
    Anomaly,
    Attempt,
    AuditEvent,
    Cluster,
    EnvironmentBinding,
    Node,
    Policy,
    Recommendation,
    Workload,
)
from recovery.schedulers.optin import parse_job_comment
from tests.factories import (
    AnomalyFactory,
    ClusterFactory,
    RecommendationFactory,
    WorkloadFactory,
)
from tests.fakes import Scripted, job

FRESH = History(attempts=1, attempts_without_checkpoint=0)


def anomaly(**fields: object) -> Anomaly:
    values: dict[str, object] = {
        "kind": AnomalyKind.CRASH,
        "category": "gpu_hardware",
        "attribution": "hardware",
        "implicated_nodes": ["gpu-007"],
    }
    values.update(fields)
    return Anomaly(**values)


def test_hardware_on_a_named_node_restarts_without_that_node() -> None:
    decision = decide(anomaly(), Policy(), FRESH)
    assert decision.action == RecommendationAction.RESTART_EXCLUDING
    assert decision.excluded_nodes == ["gpu-007"]


def test_an_application_exception_restarts_without_excluding() -> None:
    decision = decide(anomaly(category="app_exception", attribution="application"), Policy(), FRESH)
    assert decision.action == RecommendationAction.RESTART
    assert decision.excluded_nodes == []


def test_nodes_excluded_before_stay_excluded() -> None:
    history = History(2, 0, frozenset({"gpu-003"}))
    decision = decide(anomaly(category="nccl_timeout", attribution="unknown"), Policy(), history)
    assert decision.excluded_nodes == ["gpu-003"]


def test_it_stops_when_retries_stop_paying_off() -> None:
    policy = Policy(max_attempts_without_checkpoint=3)
    decision = decide(anomaly(), policy, History(attempts=4, attempts_without_checkpoint=3))
    assert decision.action == RecommendationAction.STOP
    assert "saved no checkpoint" in decision.reason
    assert decision.stop_reason == StopReason.NO_CHECKPOINT


def test_it_stops_after_the_attempt_budget() -> None:
    decision = decide(anomaly(), Policy(max_attempts=5), History(5, 0))
    assert decision.action == RecommendationAction.STOP
    assert decision.stop_reason == StopReason.RETRY_BUDGET


def test_an_application_fault_stops_at_once_only_when_the_policy_says_so() -> None:
    bug = anomaly(category="app_exception", attribution="application")
    assert decide(bug, Policy(), FRESH).action == RecommendationAction.RESTART
    stop = decide(bug, Policy(stop_on_application_fault=True), FRESH)
    assert (stop.action, stop.stop_reason) == ("stop", StopReason.APPLICATION_FAULT)


def test_a_straggler_is_recorded_or_excluded_as_the_policy_says() -> None:
    slow = anomaly(kind=AnomalyKind.STRAGGLER, category="", attribution="unknown")
    assert decide(slow, Policy(), FRESH).action == RecommendationAction.NONE
    policy = Policy(straggler_action=StragglerAction.RESTART_EXCLUDING)
    assert decide(slow, policy, FRESH).excluded_nodes == ["gpu-007"]


@pytest.mark.django_db
def test_the_most_specific_policy_wins() -> None:
    workload = WorkloadFactory(partition="gpu", environment="prod")
    Policy.objects.create(name="everywhere", max_attempts=3)
    Policy.objects.create(name="prod", environment="prod", max_attempts=4)
    Policy.objects.create(name="prod gpu here", cluster=workload.cluster, environment="prod",
                          partition="gpu", max_attempts=5)  # fmt: skip
    Policy.objects.create(name="other partition", environment="prod", partition="cpu")
    assert policy_for(workload).name == "prod gpu here"


@pytest.mark.django_db
def test_monitor_mode_records_what_it_would_have_done() -> None:
    found = AnomalyFactory(workload=WorkloadFactory(cluster=ClusterFactory()))
    recommendation = recommend(found)
    assert recommendation is not None
    assert recommendation.status == RecommendationStatus.AWAITING_APPROVAL
    event = AuditEvent.objects.get(kind=AuditKind.RECOMMENDED)
    assert event.payload["would_have_done"] is True


@pytest.mark.django_db
def test_an_acknowledged_action_mode_cluster_gets_a_ready_recommendation() -> None:
    cluster = ClusterFactory(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True)
    recommendation = recommend(AnomalyFactory(workload=WorkloadFactory(cluster=cluster)))
    assert recommendation is not None and recommendation.status == RecommendationStatus.READY


@pytest.mark.django_db
def test_a_job_opted_in_to_be_observed_waits_for_a_person_in_an_acting_cluster() -> None:
    """
    GIVEN an acknowledged action-mode cluster
    WHEN a job whose comment says "mode": "observe" fails
    THEN its recommendation awaits approval, and the trail says the job's mode held it back
    """
    cluster = ClusterFactory(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True)
    observed = WorkloadFactory(cluster=cluster, opt_in_mode=OptInMode.OBSERVE)
    recommendation = recommend(AnomalyFactory(workload=observed))
    assert recommendation is not None
    assert recommendation.status == RecommendationStatus.AWAITING_APPROVAL
    event = AuditEvent.objects.get(kind=AuditKind.RECOMMENDED)
    assert (event.payload["job_mode"], event.payload["would_have_done"]) == ("observe", True)

    approved = approve(recommendation.pk, operator="olivia")
    assert approved.recommendation.status == RecommendationStatus.READY
    assert approved.recommendation.approved_by == "olivia"


@pytest.mark.django_db
def test_one_failure_gives_one_recommendation_and_new_evidence_supersedes_it() -> None:
    cluster = ClusterFactory(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True)
    workload = WorkloadFactory(cluster=cluster)
    attempt = Attempt.objects.create(workload=workload, number=1)
    timeout = AnomalyFactory(workload=workload, attempt=attempt, category="nccl_timeout",
                             attribution="unknown", implicated_nodes=[])  # fmt: skip
    first = recommend(timeout)
    assert recommend(timeout) == first  # the same failure again
    xid = AnomalyFactory(workload=workload, attempt=attempt, implicated_nodes=["gpu-007"])
    second = recommend(xid)
    assert second is not None and second != first
    first.refresh_from_db()  # type: ignore[union-attr]
    assert first.status == RecommendationStatus.SUPERSEDED  # type: ignore[union-attr]
    assert first.superseded_by == second  # type: ignore[union-attr]
    open_ones = Recommendation.objects.filter(status=RecommendationStatus.READY)
    assert list(open_ones) == [second]


@pytest.mark.django_db
def test_excluding_too_much_of_the_cluster_asks_a_person() -> None:
    cluster = ClusterFactory(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True)
    for number in range(1, 11):
        Node.objects.create(cluster=cluster, name=f"gpu-{number:03d}")
    Policy.objects.create(name="tight", blast_radius_percent=10)
    workload = WorkloadFactory(cluster=cluster)
    wide = AnomalyFactory(workload=workload, implicated_nodes=["gpu-001", "gpu-002"])
    recommendation = recommend(wide)
    assert recommendation is not None
    assert recommendation.status == RecommendationStatus.AWAITING_APPROVAL


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("others_excluded", "asks_a_person"),
    [(["gpu-001"], False), (["gpu-003"], True)],
    ids=["the-same-node", "another-node"],
)
def test_a_node_another_job_excluded_counts_once_towards_the_blast_radius(
    others_excluded: list[str], asks_a_person: bool
) -> None:
    """
    GIVEN ten nodes, a blast radius of 10 %, and another job's restart that excluded a node
    WHEN a crash implicating gpu-001 is decided
    THEN excluding gpu-001 again stays within the radius (one node of ten) and is ready, and
         excluding it beside another node goes over it and asks a person; the facts name the
         time of gpu-001's exclusion and count the other node only by the minute
    """
    cluster = ClusterFactory(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True)
    for number in range(1, 11):
        Node.objects.create(cluster=cluster, name=f"gpu-{number:03d}")
    Policy.objects.create(name="tight", blast_radius_percent=10)
    other = WorkloadFactory(cluster=cluster, job_id="other-job")
    RecommendationFactory(workload=other, excluded_nodes=others_excluded)
    workload = WorkloadFactory(cluster=cluster)
    crash = AnomalyFactory(workload=workload, implicated_nodes=["gpu-001"])
    recommendation = recommend(crash)
    assert recommendation is not None
    assert recommendation.excluded_nodes == ["gpu-001"]
    wanted = RecommendationStatus.AWAITING_APPROVAL if asks_a_person else RecommendationStatus.READY
    assert recommendation.status == wanted
    facts = crash.decision_facts
    assert sorted(facts["excluded_at"]) == [n for n in others_excluded if n == "gpu-001"]
    assert sum(count for _, count in facts["excluded_by_minute"]) == 1


# ---------- the job's policy and the cluster's: who chooses which ----------


def test_every_policy_setting_says_which_choice_it_is_read_from() -> None:
    """A new setting must be classed: read from the job's choice, the cluster's, or both."""
    scope = {"id", "name", "enabled", "cluster", "environment", "partition", "updated_at"}
    settings = {field.name for field in Policy._meta.concrete_fields} - scope
    assert settings == Policy.FOR_THE_JOB | Policy.FOR_THE_SITE
    assert "blast_radius_percent" not in Policy.FOR_THE_JOB
    assert "max_attempts" not in Policy.FOR_THE_SITE


def lenient_environment(cluster: Cluster) -> None:
    Policy.objects.create(name="lab", cluster=cluster, blast_radius_percent=10)
    Policy.objects.create(
        name="lab scratch", cluster=cluster, environment="scratch", blast_radius_percent=100
    )


@pytest.mark.django_db
def test_the_site_policy_is_the_clusters_unless_the_environment_is_bound() -> None:
    cluster = ClusterFactory(environment="prod")
    lenient_environment(cluster)
    Policy.objects.create(name="lab prod", cluster=cluster, environment="prod")
    named_none = WorkloadFactory(cluster=cluster, environment="prod")  # the cluster's own
    assert site_policy(named_none) == SitePolicy(policy_for(named_none), "prod")

    scratch = WorkloadFactory(cluster=cluster, environment="scratch", partition="prod")
    assert policy_for(scratch).name == "lab scratch"
    chosen = site_policy(scratch)
    assert (chosen.policy.name, chosen.environment) == ("lab prod", "prod")
    assert chosen.refused == (
        "environment 'scratch' is not bound to partition 'prod' on this cluster: the "
        "cluster's policy applies to nodes and other jobs"
    )

    binding = EnvironmentBinding.objects.create(
        cluster=cluster, environment="scratch", partition="prod"
    )
    assert site_policy(scratch) == SitePolicy(policy_for(scratch), "scratch", binding)
    assert site_policy_for(scratch).name == "lab scratch"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("bound", "partition", "account", "honoured"),
    [
        ({"account": "physics"}, "prod", "physics", True),
        ({"account": "physics"}, "prod", "", False),  # no account known: no account binding
        ({"account": "physics"}, "prod", "chemistry", False),
        ({"partition": "prod", "account": "physics"}, "prod", "physics", True),
        ({"partition": "prod", "account": "physics"}, "gpu", "physics", False),
        ({"partition": "prod", "account": "physics"}, "prod", "chemistry", False),
        ({"partition": "scratch"}, "prod", "physics", False),
        ({"partition": "prod"}, "prod,scratch", "physics", False),  # pending on several
        ({"any_job": True}, "prod", "", True),
    ],
)
def test_a_binding_covers_the_jobs_it_names_and_no_others(
    bound: dict[str, object], partition: str, account: str, honoured: bool
) -> None:
    cluster = ClusterFactory()
    lenient_environment(cluster)
    EnvironmentBinding.objects.create(cluster=cluster, environment="scratch", **bound)
    workload = WorkloadFactory(
        cluster=cluster, environment="scratch", partition=partition, account=account
    )
    assert (site_policy_for(workload).name == "lab scratch") is honoured
    assert policy_for(workload).name == "lab scratch"  # its own recovery: always its choice


@pytest.mark.django_db
def test_a_binding_on_another_cluster_or_for_another_environment_counts_for_nothing() -> None:
    cluster, other = ClusterFactory(), ClusterFactory()
    lenient_environment(cluster)
    EnvironmentBinding.objects.create(cluster=other, environment="scratch", any_job=True)
    EnvironmentBinding.objects.create(cluster=cluster, environment="debug", any_job=True)
    workload = WorkloadFactory(cluster=cluster, environment="scratch")
    assert site_policy_for(workload).name == "lab"


@pytest.mark.django_db
def test_an_environment_that_would_choose_the_clusters_policy_anyway_is_not_refused() -> None:
    cluster = ClusterFactory()
    lenient_environment(cluster)
    workload = WorkloadFactory(cluster=cluster, environment="no-policy-names-it")
    assert site_policy(workload) == SitePolicy(policy_for(workload), "")


@pytest.mark.django_db
def test_the_clusters_nodes_kept_out_of_a_restart_follow_the_clusters_policy() -> None:
    """A job's environment may not widen or narrow which of the cluster's nodes every restart
    keeps out: its restart's excluded nodes count against everyone's blast radius."""
    cluster = ClusterFactory()
    Node.objects.create(cluster=cluster, name="gpu-001", suspect_since=timezone.now())
    Policy.objects.create(name="lab", cluster=cluster, keep_out_cluster_nodes=[])
    Policy.objects.create(
        name="lab scratch",
        cluster=cluster,
        environment="scratch",
        keep_out_cluster_nodes=[ClusterNodeState.SUSPECT],
    )
    workload = WorkloadFactory(cluster=cluster, environment="scratch")
    assert history_of(workload, policy_for(workload)).cluster_nodes == {}
    EnvironmentBinding.objects.create(cluster=cluster, environment="scratch", any_job=True)
    assert history_of(workload, policy_for(workload)).cluster_nodes == {"gpu-001": "suspect"}


@pytest.mark.django_db
def test_policies_read_once_serves_both_choices_without_a_query(
    django_assert_num_queries: Any,
) -> None:
    cluster = ClusterFactory()
    lenient_environment(cluster)
    EnvironmentBinding.objects.create(cluster=cluster, environment="scratch", partition="gpu")
    bound = WorkloadFactory(cluster=cluster, environment="scratch", partition="gpu")
    refused = WorkloadFactory(cluster=cluster, environment="scratch", partition="cpu")
    with policies_read_once():
        with django_assert_num_queries(0):
            assert site_policy_for(bound).name == "lab scratch"
            assert site_policy(refused).refused
            assert site_policy_for(refused).name == "lab"
            assert policy_for(refused).name == "lab scratch"
        # Edited meanwhile: applies from the next reading.
        EnvironmentBinding.objects.create(cluster=cluster, environment="scratch", any_job=True)
        assert site_policy_for(refused).name == "lab"
    assert site_policy_for(refused).name == "lab scratch"


@pytest.mark.django_db
def test_the_poll_keeps_the_account_the_scheduler_reports() -> None:
    cluster = ClusterFactory()
    lenient_environment(cluster)
    EnvironmentBinding.objects.create(cluster=cluster, environment="scratch", account="physics")
    comment = '{"nvidia-recovery":{"environment":"scratch","mode":"act"}}'
    reported = job(comment=comment, opt_in=parse_job_comment(comment), account="physics")
    poll_cluster(cluster, Scripted([reported]))
    workload = Workload.objects.get()
    assert (workload.environment, workload.account) == ("scratch", "physics")
    assert site_policy_for(workload).name == "lab scratch"

    poll_cluster(cluster, Scripted([replace(reported, account=None)]))  # unknown now
    workload.refresh_from_db()
    assert workload.account == ""
    assert site_policy_for(workload).name == "lab"
