"""Each cluster at a glance: how far it may act on its own, what runs degraded, what waits.

Read by the Console's Clusters page. The figures come from a fixed number of grouped queries,
whatever the number of clusters: one for the clusters, one per count family, and at most one
for the attribution provider's last outcome (cached by ``recovery.sources.provider_status``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from django.conf import settings
from django.db.models import Count, Q

from recovery.choices import ClusterMode, RecommendationStatus, WorkloadState
from recovery.models import Cluster, Node, Recommendation, Workload
from recovery.read.controllers import CONTROLLER_SEEN_WITHIN, ClusterControllers, controllers_of
from recovery.read.controllers import ago as _ago
from recovery.sources.provider_status import (
    NO_PROVIDER_REASON,
    AttributionStatus,
    attribution_status,
)

# Polls run every POLL_SECONDS; three missed rounds is more than a slow poll or a busy worker.
STALE_AFTER_POLLS = 3

NOT_POLLED_RECORDED = "not polled: recorded history"


class WarningKind(StrEnum):
    NO_ATTRIBUTION_PROVIDER = "no_attribution_provider"
    ATTRIBUTION_FAILING = "attribution_failing"
    SCHEDULER_UNREACHABLE = "scheduler_unreachable"
    POLLING_STALE = "polling_stale"
    NO_CONTROLLER = "no_controller"


class WarningSeverity(StrEnum):
    """How much a degraded mode changes what the cluster does.

    ``info``: recovery works as configured, with less to go on. ``warning``: recovery works on
    stale or partial information. ``critical``: decisions the cluster is set to make will not
    reach the scheduler, or are made on a state that can no longer be read.
    """

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


@dataclass(frozen=True)
class StatusWarning:
    kind: WarningKind
    severity: WarningSeverity
    sentence: str
    detail: str = ""


@dataclass(frozen=True)
class ClusterCounts:
    workloads_running: int = 0
    pending_approvals: int = 0
    suspect_nodes: int = 0
    excluded_nodes: int = 0


@dataclass(frozen=True)
class ClusterStatus:
    cluster: Cluster
    mode_meaning: str
    polled: bool
    polling_note: str
    counts: ClusterCounts
    last_polled_ago: str = ""
    controller_last_seen: datetime | None = None
    controller_seen_ago: str = ""
    controllers: ClusterControllers | None = None
    warnings: list[StatusWarning] = field(default_factory=list)

    @property
    def acknowledged(self) -> bool:
        return self.cluster.acknowledge_scheduler_actions

    @property
    def warning_kinds(self) -> list[WarningKind]:
        return [warning.kind for warning in self.warnings]


@dataclass(frozen=True)
class _Controllers:
    tokens: int
    last_seen: datetime | None


def cluster_statuses(
    now: datetime, *, attribution: AttributionStatus | None = None
) -> list[ClusterStatus]:
    """Every cluster, by name, with its mode's meaning, degraded modes and counts at ``now``."""
    clusters = list(Cluster.objects.order_by("name"))
    if not clusters:
        return []
    attribution = attribution if attribution is not None else attribution_status()
    counts = _counts(now)
    seen = controllers_of(clusters, now)
    statuses = []
    for cluster in clusters:
        polled = cluster.is_polled
        controller = _Controllers(len(seen[cluster.pk].controllers), seen[cluster.pk].last_seen)
        warnings = _attribution_warnings(attribution)
        if polled:
            warnings += _polling_warnings(cluster, now)
            pending = counts.get(cluster.pk, ClusterCounts()).pending_approvals
            warnings += _controller_warnings(cluster, controller, now, pending)
        statuses.append(
            ClusterStatus(
                cluster=cluster,
                mode_meaning=mode_meaning(cluster),
                polled=polled,
                polling_note="" if polled else NOT_POLLED_RECORDED,
                counts=counts.get(cluster.pk, ClusterCounts()),
                last_polled_ago=_ago(cluster.last_polled_at, now) if cluster.last_polled_at else "",
                controller_last_seen=controller.last_seen,
                controller_seen_ago=_ago(controller.last_seen, now) if controller.last_seen else "",
                controllers=seen[cluster.pk],
                warnings=warnings,
            )
        )
    return statuses


def mode_meaning(cluster: Cluster) -> str:
    """What the cluster's mode and acknowledgement let recovery do, in one sentence."""
    if cluster.mode != ClusterMode.ACTION:
        return "Monitor mode: nothing acts without approval."
    if cluster.acknowledge_scheduler_actions:
        return "Action mode, acknowledged: acts automatically."
    return "Action mode but not acknowledged: acts only on approval."


def _attribution_warnings(status: AttributionStatus) -> list[StatusWarning]:
    # The provider is shared by every cluster; it is repeated per cluster so each card tells
    # the whole story of what that cluster's decisions rest on.
    if not status.degraded:
        return []
    if status.reason == NO_PROVIDER_REASON:
        return [
            StatusWarning(
                WarningKind.NO_ATTRIBUTION_PROVIDER,
                WarningSeverity.INFO,
                "No external attribution provider: failures are attributed by built-in rules only.",
            )
        ]
    return [
        StatusWarning(
            WarningKind.ATTRIBUTION_FAILING,
            WarningSeverity.WARNING,
            f"Attribution provider {status.provider} is failing ({status.reason}): "
            "built-in rules only until it answers again.",
        )
    ]


def _polling_warnings(cluster: Cluster, now: datetime) -> list[StatusWarning]:
    polled_at = cluster.last_polled_at
    failed_at = cluster.last_poll_error_at
    if cluster.last_poll_error and (
        polled_at is None or failed_at is None or failed_at > polled_at
    ):
        failed = f"the last poll failed {_ago(failed_at, now)}" if failed_at else "a poll failed"
        succeeded = (
            f"last successful poll {_ago(polled_at, now)}"
            if polled_at is not None
            else "never polled successfully"
        )
        # Covers staleness too: why polls are missing is the more useful sentence.
        return [
            StatusWarning(
                WarningKind.SCHEDULER_UNREACHABLE,
                WarningSeverity.CRITICAL,
                f"Scheduler unreachable: {failed}, {succeeded}. Job and node states are not "
                "up to date.",
                detail=cluster.last_poll_error,
            )
        ]
    stale_after = timedelta(seconds=STALE_AFTER_POLLS * settings.POLL_SECONDS)
    if polled_at is None:
        return [
            StatusWarning(
                WarningKind.POLLING_STALE,
                WarningSeverity.WARNING,
                "Never polled: is the poller (Celery beat and a worker) running?",
            )
        ]
    if polled_at < now - stale_after:
        return [
            StatusWarning(
                WarningKind.POLLING_STALE,
                WarningSeverity.WARNING,
                f"Polling is late: last poll {_ago(polled_at, now)}, expected every "
                f"{settings.POLL_SECONDS} s. Job and node states may be out of date.",
            )
        ]
    return []


def _controller_warnings(
    cluster: Cluster, controller: _Controllers, now: datetime, awaiting_approval: int
) -> list[StatusWarning]:
    """Whatever the mode, a scheduler-side controller carries out what is decided or approved."""
    if cluster.mode != ClusterMode.ACTION:
        # Monitor mode acts only on approval, and an approval waits for a controller as well:
        # worth saying once something awaits one.
        if not awaiting_approval:
            return []
        severity = WarningSeverity.WARNING
        consequence = "an approval will wait, and expire, unclaimed."
    else:
        # Acknowledged clusters act without a person in the loop: a missing controller means
        # failed jobs wait for nobody. Otherwise approved recommendations wait the same way.
        acts = cluster.acts_automatically
        severity = WarningSeverity.CRITICAL if acts else WarningSeverity.WARNING
        consequence = "recommendations are not carried out."
    if controller.tokens == 0:
        sentence = f"No controller token issued for this cluster: {consequence}"
    elif controller.last_seen is None:
        sentence = f"No controller has called in yet: {consequence}"
    elif controller.last_seen < now - CONTROLLER_SEEN_WITHIN:
        sentence = f"No controller seen since {_ago(controller.last_seen, now)}: {consequence}"
    else:
        return []
    return [StatusWarning(WarningKind.NO_CONTROLLER, severity, sentence)]


def _counts(now: datetime) -> dict[int, ClusterCounts]:
    """Per-cluster counts from three grouped queries, one row per cluster with anything."""
    running = dict(
        Workload.objects.filter(state=WorkloadState.RUNNING)
        .order_by()
        .values("cluster_id")
        .annotate(n=Count("id"))
        .values_list("cluster_id", "n")
    )
    approvals = dict(
        Recommendation.objects.filter(status=RecommendationStatus.AWAITING_APPROVAL)
        .order_by()
        .values("workload__cluster_id")
        .annotate(n=Count("id"))
        .values_list("workload__cluster_id", "n")
    )
    suspect = Q(suspect_since__isnull=False)
    excluded = Node.excluded_at(now)
    nodes = {
        row["cluster_id"]: (row["suspect"], row["excluded"])
        for row in Node.objects.filter(suspect | excluded)
        .order_by()
        .values("cluster_id")
        .annotate(suspect=Count("id", filter=suspect), excluded=Count("id", filter=excluded))
    }
    counts = {}
    for cluster_id in running.keys() | approvals.keys() | nodes.keys():
        suspect_nodes, excluded_nodes = nodes.get(cluster_id, (0, 0))
        counts[cluster_id] = ClusterCounts(
            workloads_running=running.get(cluster_id, 0),
            pending_approvals=approvals.get(cluster_id, 0),
            suspect_nodes=suspect_nodes,
            excluded_nodes=excluded_nodes,
        )
    return counts
