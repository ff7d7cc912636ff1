"""Each cluster's status: its mode's meaning, degraded modes and counts; and how polls record
their failures for it."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from pytest_django.fixtures import Settings as SettingsWrapper

from recovery.choices import (
    ClusterMode,
    Connection,
    RecommendationStatus,
    WorkloadState,
)
from recovery.loop.poll import POLL_ERROR_LENGTH, poll_cluster, poll_failure_reason
from recovery.models import Cluster, ControllerToken, Node
from recovery.read.cluster_status import (
    NOT_POLLED_RECORDED,
    ClusterStatus,
    WarningKind,
    WarningSeverity,
    cluster_statuses,
)
from recovery.schedulers.base import JobInfo, NodeInfo, SchedulerAdapter, SchedulerError
from recovery.sources.provider_status import NO_PROVIDER_REASON, AttributionStatus
from tasks.polling import poll_cluster as poll_cluster_task
from tests.factories import ClusterFactory, RecommendationFactory, WorkloadFactory

pytestmark = pytest.mark.django_db

NOW = datetime(2025, 3, 14, 12, 0, 0, tzinfo=UTC)
PROVIDER_ANSWERS = AttributionStatus("attrib.example:8443", False, "provider answered", NOW)
NO_PROVIDER = AttributionStatus(None, True, NO_PROVIDER_REASON)
PROVIDER_FAILING = AttributionStatus("attrib.example:8443", True, "timed out after 2 s", NOW)
RECORDED = {"recorded": {"nodes": "gpu-[001-004]", "gpus_per_node": 8}}


@pytest.fixture(autouse=True)
def _poll_every_five_seconds(settings: SettingsWrapper) -> None:
    settings.POLL_SECONDS = 5


def polled_cluster(**fields: Any) -> Cluster:
    """A Slurm cluster polled a moment ago, so only what a test changes is degraded."""
    return ClusterFactory(**{"last_polled_at": NOW - timedelta(seconds=2), **fields})


def status_of(
    cluster: Cluster, attribution: AttributionStatus = PROVIDER_ANSWERS, now: datetime = NOW
) -> ClusterStatus:
    return next(s for s in cluster_statuses(now, attribution=attribution) if s.cluster == cluster)


def used_token(cluster: Cluster, last_used_at: datetime | None, name: str = "advisor") -> None:
    token, _ = ControllerToken.issue(cluster, name)
    ControllerToken.objects.filter(pk=token.pk).update(last_used_at=last_used_at)


# --- modes ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "acknowledged", "meaning"),
    [
        (ClusterMode.MONITOR, False, "Monitor mode: nothing acts without approval."),
        # The acknowledgement only unlocks action mode; on its own it changes nothing.
        (ClusterMode.MONITOR, True, "Monitor mode: nothing acts without approval."),
        (ClusterMode.ACTION, True, "Action mode, acknowledged: acts automatically."),
        (ClusterMode.ACTION, False, "Action mode but not acknowledged: acts only on approval."),
    ],
)
def test_it_says_what_the_mode_and_acknowledgement_let_recovery_do(
    mode: str, acknowledged: bool, meaning: str
) -> None:
    cluster = polled_cluster(mode=mode, acknowledge_scheduler_actions=acknowledged)
    used_token(cluster, NOW - timedelta(seconds=3))
    status = status_of(cluster)
    assert status.mode_meaning == meaning
    assert status.acknowledged is acknowledged
    assert status.warnings == []


def test_a_healthy_cluster_has_no_warnings_and_says_when_it_was_polled() -> None:
    cluster = polled_cluster(last_polled_at=NOW - timedelta(seconds=4))
    status = status_of(cluster)
    assert status.warnings == []
    assert status.polled
    assert status.polling_note == ""
    assert status.last_polled_ago == "4 s ago"


# --- attribution ----------------------------------------------------------------------------


def test_without_a_provider_every_cluster_says_attribution_runs_on_built_in_rules() -> None:
    clusters = [polled_cluster(), polled_cluster()]
    statuses = cluster_statuses(NOW, attribution=NO_PROVIDER)
    assert [s.cluster for s in statuses] == sorted(clusters, key=lambda c: c.name)
    for status in statuses:
        [warning] = status.warnings
        assert warning.kind == WarningKind.NO_ATTRIBUTION_PROVIDER
        assert warning.severity == WarningSeverity.INFO
        assert "built-in rules only" in warning.sentence


def test_a_failing_provider_is_named_with_its_reason() -> None:
    [warning] = status_of(polled_cluster(), PROVIDER_FAILING).warnings
    assert warning.kind == WarningKind.ATTRIBUTION_FAILING
    assert warning.severity == WarningSeverity.WARNING
    assert "attrib.example:8443" in warning.sentence
    assert "timed out after 2 s" in warning.sentence


def test_it_reads_the_attribution_status_itself_when_not_given(settings: SettingsWrapper) -> None:
    settings.ATTRIBUTION_PROVIDER_URL = ""
    cluster = polled_cluster()
    [status] = cluster_statuses(NOW)
    assert status.cluster == cluster
    assert status.warning_kinds == [WarningKind.NO_ATTRIBUTION_PROVIDER]


# --- polling --------------------------------------------------------------------------------


def test_a_poll_error_newer_than_the_last_poll_means_the_scheduler_is_unreachable() -> None:
    cluster = polled_cluster(
        last_polled_at=NOW - timedelta(minutes=30),
        last_poll_error="cannot reach slurm-login:22: [Errno 111] Connection refused",
        last_poll_error_at=NOW - timedelta(seconds=20),
    )
    [warning] = status_of(cluster).warnings
    assert warning.kind == WarningKind.SCHEDULER_UNREACHABLE
    assert warning.severity == WarningSeverity.CRITICAL
    # The error explains the late polls: one warning, not an extra "polling is late".
    assert "the last poll failed 20 s ago" in warning.sentence
    assert "last successful poll 30\xa0minutes ago" in warning.sentence
    assert warning.detail == "cannot reach slurm-login:22: [Errno 111] Connection refused"


def test_a_cluster_that_never_polled_successfully_says_so() -> None:
    cluster = ClusterFactory(
        last_poll_error="`squeue` is not installed on this host",
        last_poll_error_at=NOW - timedelta(seconds=5),
    )
    [warning] = status_of(cluster).warnings
    assert warning.kind == WarningKind.SCHEDULER_UNREACHABLE
    assert "never polled successfully" in warning.sentence


def test_an_error_older_than_the_last_successful_poll_is_not_reported() -> None:
    cluster = polled_cluster(
        last_poll_error="old trouble", last_poll_error_at=NOW - timedelta(hours=1)
    )
    assert status_of(cluster).warnings == []


def test_polling_is_late_after_three_missed_rounds() -> None:
    on_time = polled_cluster(last_polled_at=NOW - timedelta(seconds=15))
    late = polled_cluster(last_polled_at=NOW - timedelta(seconds=16))
    assert status_of(on_time).warnings == []
    [warning] = status_of(late).warnings
    assert warning.kind == WarningKind.POLLING_STALE
    assert warning.severity == WarningSeverity.WARNING
    assert "last poll 16 s ago, expected every 5 s" in warning.sentence


def test_the_stale_threshold_follows_the_poll_interval(settings: SettingsWrapper) -> None:
    settings.POLL_SECONDS = 60
    cluster = polled_cluster(last_polled_at=NOW - timedelta(minutes=2))
    assert status_of(cluster).warnings == []


def test_a_cluster_never_polled_is_a_stale_warning() -> None:
    [warning] = status_of(ClusterFactory()).warnings
    assert warning.kind == WarningKind.POLLING_STALE
    assert warning.sentence.startswith("Never polled")


def test_recorded_history_is_not_polled_and_never_warns_about_polling_or_controllers() -> None:
    cluster = ClusterFactory(
        connection=Connection.SIMULATED,
        connection_settings=RECORDED,
        mode=ClusterMode.ACTION,
        acknowledge_scheduler_actions=True,
    )
    status = status_of(cluster)
    assert not status.polled
    assert status.polling_note == NOT_POLLED_RECORDED == "not polled: recorded history"
    assert status.warnings == []
    # The provider is about attribution, which recorded history shows as well.
    assert status_of(cluster, NO_PROVIDER).warning_kinds == [WarningKind.NO_ATTRIBUTION_PROVIDER]


def test_a_running_simulation_is_polled_like_slurm() -> None:
    cluster = ClusterFactory(
        connection=Connection.SIMULATED,
        connection_settings={"simulator": {"name": "sim-1"}},
    )
    status = status_of(cluster)
    assert status.polled
    assert status.warning_kinds == [WarningKind.POLLING_STALE]


# --- controllers ----------------------------------------------------------------------------


def action_cluster(acknowledged: bool = True) -> Cluster:
    return polled_cluster(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=acknowledged)


def test_an_action_cluster_without_a_controller_token_warns() -> None:
    [warning] = status_of(action_cluster()).warnings
    assert warning.kind == WarningKind.NO_CONTROLLER
    assert warning.severity == WarningSeverity.CRITICAL
    assert warning.sentence.startswith("No controller token issued")


def test_without_acknowledgement_a_missing_controller_is_a_warning_not_critical() -> None:
    [warning] = status_of(action_cluster(acknowledged=False)).warnings
    assert (warning.kind, warning.severity) == (WarningKind.NO_CONTROLLER, WarningSeverity.WARNING)


def test_a_revoked_token_does_not_count_as_a_controller() -> None:
    cluster = action_cluster()
    used_token(cluster, NOW - timedelta(seconds=3))
    ControllerToken.objects.update(revoked_at=NOW - timedelta(seconds=1))
    assert status_of(cluster).warning_kinds == [WarningKind.NO_CONTROLLER]


def test_a_token_never_used_means_no_controller_has_called_in() -> None:
    cluster = action_cluster()
    used_token(cluster, None)
    [warning] = status_of(cluster).warnings
    assert warning.sentence.startswith("No controller has called in yet")


def test_a_controller_silent_for_minutes_is_gone_and_a_recent_one_is_fine() -> None:
    gone = action_cluster()
    used_token(gone, NOW - timedelta(minutes=7))
    recent = action_cluster()
    used_token(recent, NOW - timedelta(minutes=9), name="old")
    used_token(recent, NOW - timedelta(seconds=5), name="current")
    [warning] = status_of(gone).warnings
    assert warning.kind == WarningKind.NO_CONTROLLER
    assert "No controller seen since 7\xa0minutes ago" in warning.sentence
    status = status_of(recent)
    assert status.warnings == []
    assert status.controller_last_seen == NOW - timedelta(seconds=5)


def test_monitor_mode_needs_no_controller_to_be_healthy() -> None:
    assert status_of(polled_cluster(mode=ClusterMode.MONITOR)).warnings == []


def test_every_degraded_mode_at_once_is_listed_in_order() -> None:
    cluster = ClusterFactory(
        mode=ClusterMode.ACTION,
        acknowledge_scheduler_actions=True,
        last_poll_error="SSH to slurm-login failed: timed out",
        last_poll_error_at=NOW - timedelta(seconds=30),
    )
    assert status_of(cluster, PROVIDER_FAILING).warning_kinds == [
        WarningKind.ATTRIBUTION_FAILING,
        WarningKind.SCHEDULER_UNREACHABLE,
        WarningKind.NO_CONTROLLER,
    ]


# --- counts ---------------------------------------------------------------------------------


def node(cluster: Cluster, name: str, **fields: Any) -> Node:
    return Node.objects.create(cluster=cluster, name=name, **fields)


def test_it_counts_running_workloads_approvals_suspect_and_excluded_nodes_per_cluster() -> None:
    lab, prod, empty = polled_cluster(name="lab"), polled_cluster(name="prod"), polled_cluster()
    WorkloadFactory.create_batch(3, cluster=lab, state=WorkloadState.RUNNING)
    WorkloadFactory(cluster=lab, state=WorkloadState.PENDING)
    WorkloadFactory(cluster=lab, state=WorkloadState.COMPLETED)
    waiting = WorkloadFactory(cluster=prod, state=WorkloadState.REQUEUED)
    RecommendationFactory.create_batch(2, workload=waiting)
    RecommendationFactory(workload=waiting, status=RecommendationStatus.REJECTED)
    RecommendationFactory(workload=waiting, status=RecommendationStatus.READY)
    node(lab, "gpu-001", suspect_since=NOW - timedelta(hours=1))
    node(lab, "gpu-002", suspect_since=NOW, excluded_until=NOW + timedelta(hours=2))
    node(lab, "gpu-003", excluded_until=NOW - timedelta(seconds=1))  # no longer excluded
    node(prod, "gpu-101", excluded_until=NOW + timedelta(minutes=1))
    node(prod, "gpu-102")
    counts = {s.cluster.name: s.counts for s in cluster_statuses(NOW, attribution=NO_PROVIDER)}
    assert (
        counts["lab"].workloads_running,
        counts["lab"].pending_approvals,
        counts["lab"].suspect_nodes,
        counts["lab"].excluded_nodes,
    ) == (3, 0, 2, 1)
    assert (
        counts["prod"].workloads_running,
        counts["prod"].pending_approvals,
        counts["prod"].suspect_nodes,
        counts["prod"].excluded_nodes,
    ) == (0, 2, 0, 1)
    assert counts[empty.name] == type(counts["lab"])()


def statuses_queries(attribution: AttributionStatus = NO_PROVIDER) -> int:
    with CaptureQueriesContext(connection) as queries:
        cluster_statuses(NOW, attribution=attribution)
    return len(queries)


def populate(cluster: Cluster) -> None:
    WorkloadFactory(cluster=cluster, state=WorkloadState.RUNNING)
    RecommendationFactory(workload__cluster=cluster)
    node(cluster, f"{cluster.name}-n1", suspect_since=NOW, excluded_until=NOW + timedelta(hours=1))
    used_token(cluster, NOW)


def test_the_number_of_queries_does_not_grow_with_the_clusters() -> None:
    for _ in range(2):
        populate(action_cluster())
    few = statuses_queries()
    for _ in range(8):
        populate(action_cluster())
    assert statuses_queries() == few <= 5


# --- recording poll failures ----------------------------------------------------------------


class Answering(SchedulerAdapter):
    """A scheduler with nothing running: every poll succeeds."""

    def list_jobs(self) -> list[JobInfo]:
        return []

    def list_nodes(self) -> list[NodeInfo]:
        return [NodeInfo("gpu-001", "IDLE")]

    def get_job(self, job_id: str) -> JobInfo | None:
        return None

    def _refuse(self, *args: object, **kwargs: object) -> object:
        raise AssertionError("polling never acts")

    requeue = set_excluded_nodes = clear_start_delay = release = hold = cancel = _refuse  # type: ignore[assignment]
    disable_requeue = _refuse  # type: ignore[assignment]


class Unreachable(Answering):
    def __init__(self, error: Exception) -> None:
        self.error = error

    def list_nodes(self) -> list[NodeInfo]:
        raise self.error


def reloaded(cluster: Cluster) -> Cluster:
    cluster.refresh_from_db()
    return cluster


def test_a_failing_poll_records_why_and_a_later_success_clears_it() -> None:
    """
    GIVEN a cluster polled successfully a minute ago
    WHEN the next poll cannot reach the scheduler
    THEN the poll still raises, and the cluster keeps a one-line reason and the time
    WHEN a later poll succeeds
    THEN the reason is cleared and the cluster counts as polled at that time
    """
    cluster = ClusterFactory(last_polled_at=NOW - timedelta(minutes=1))
    refused = SchedulerError("`sinfo` exited 1:\nslurm_load_node error:\n  Unable to contact")
    with pytest.raises(SchedulerError):
        poll_cluster(cluster, Unreachable(refused), now=NOW, ingest_logs=False)
    cluster = reloaded(cluster)
    assert cluster.last_poll_error == "`sinfo` exited 1: slurm_load_node error: Unable to contact"
    assert cluster.last_poll_error_at == NOW
    assert cluster.last_polled_at == NOW - timedelta(minutes=1)
    assert status_of(cluster, now=NOW).warning_kinds == [WarningKind.SCHEDULER_UNREACHABLE]

    later = NOW + timedelta(seconds=5)
    poll_cluster(cluster, Answering(), now=later, ingest_logs=False)
    cluster = reloaded(cluster)
    assert (cluster.last_poll_error, cluster.last_poll_error_at) == ("", None)
    assert cluster.last_polled_at == later
    assert status_of(cluster, now=later).warnings == []


def test_an_unexpected_exception_is_recorded_with_its_type_and_still_raised() -> None:
    cluster = ClusterFactory()
    with pytest.raises(RuntimeError, match="boom"):
        poll_cluster(cluster, Unreachable(RuntimeError("boom")), now=NOW, ingest_logs=False)
    assert reloaded(cluster).last_poll_error == "RuntimeError: boom"


def test_a_poll_that_failed_before_a_newer_success_does_not_mark_the_cluster() -> None:
    cluster = ClusterFactory(last_polled_at=NOW)
    with pytest.raises(SchedulerError):
        poll_cluster(cluster, Unreachable(SchedulerError("late")), now=NOW - timedelta(seconds=3))
    assert reloaded(cluster).last_poll_error == ""


def test_a_success_older_than_a_recorded_failure_leaves_the_failure_standing() -> None:
    cluster = ClusterFactory(last_poll_error="down", last_poll_error_at=NOW)
    poll_cluster(cluster, Answering(), now=NOW - timedelta(seconds=3), ingest_logs=False)
    cluster = reloaded(cluster)
    assert (cluster.last_poll_error, cluster.last_poll_error_at) == ("down", NOW)


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (SchedulerError("cannot reach h:22: refused"), "cannot reach h:22: refused"),
        (SchedulerError(""), "SchedulerError"),
        (TimeoutError(), "TimeoutError"),
        (ValueError("bad\n\tvalue"), "ValueError: bad value"),
    ],
)
def test_the_reason_is_one_line(error: Exception, reason: str) -> None:
    assert poll_failure_reason(error) == reason


def test_a_long_reason_is_cut_to_fit_the_column() -> None:
    reason = poll_failure_reason(SchedulerError("x" * 2000))
    assert len(reason) == POLL_ERROR_LENGTH == Cluster._meta.get_field("last_poll_error").max_length
    assert reason.endswith("…")


def test_the_task_logs_a_scheduler_error_and_the_cluster_records_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """
    GIVEN a cluster reached over SSH whose settings are incomplete
    WHEN the beat's poll task runs for it
    THEN the task reports an error and logs it as before, and the cluster says why
    """
    cluster = ClusterFactory(connection=Connection.SSH, connection_settings={"host": "login1"})
    with caplog.at_level(logging.WARNING, logger="tasks.polling"):
        assert poll_cluster_task(cluster.pk) == {"error": 1}
    assert "SSH settings incomplete" in caplog.text
    cluster = reloaded(cluster)
    assert cluster.last_poll_error.startswith(f"cluster {cluster.name}: SSH settings incomplete")
    assert cluster.last_poll_error_at is not None
    assert cluster.last_polled_at is None


def test_monitor_mode_with_approvals_waiting_and_no_controller_warns_that_approving_waits() -> None:
    cluster = polled_cluster(mode=ClusterMode.MONITOR)
    RecommendationFactory(workload__cluster=cluster, status=RecommendationStatus.AWAITING_APPROVAL)
    (warning,) = status_of(cluster).warnings
    assert warning.kind == WarningKind.NO_CONTROLLER
    assert warning.severity == WarningSeverity.WARNING
    assert warning.sentence == (
        "No controller token issued for this cluster: an approval will wait, and expire, unclaimed."
    )
    token, _ = ControllerToken.issue(cluster, "login-1")
    ControllerToken.objects.filter(pk=token.pk).update(last_used_at=NOW - timedelta(seconds=5))
    assert status_of(cluster).warnings == []
    (status,) = cluster_statuses(NOW, attribution=NO_PROVIDER)
    assert status.controllers is not None
    assert [c.name for c in status.controllers.controllers] == ["login-1"]
