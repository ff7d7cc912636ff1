"""One workload: its attempts, goodput, recommendations, anomalies and audit trail."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone

from console.access import console_view
from console.charts import figure_payload
from console.forms import DecisionForm
from console.timeline import workload_timeline as workload_timeline_figure
from recovery.loop.policy import policies_read_once, policy_for, site_policy
from recovery.models import Anomaly, Attempt, Cluster, Node, Recommendation, Workload
from recovery.read.controllers import controllers_of
from recovery.read.goodput import (
    Distribution,
    WorkloadGoodput,
    workload_goodput,
)
from recovery.read.hostlist import compress_hostnames, compress_ranks, sorted_hostnames
from recovery.read.nodes import HEALTH_SAYS_SUSPECT, SUSPECT, is_suspect
from recovery.read.queries import workload_trail
from recovery.read.timeline import (
    AnomalyEntry,
    action_standings,
    anomalies_in_causal_order,
    latest_action,
    story_events,
)

PAGE_ANOMALIES = 50
PAGE_RECOMMENDATIONS = 50


@console_view("recovery.view_workload", "Viewing a workload")
def workload_detail(request: HttpRequest, workload_id: int) -> HttpResponse:
    workload = get_object_or_404(
        Workload.objects.select_related("cluster", "workflow"), pk=workload_id
    )
    now = timezone.now()
    attempts = list(workload.attempts.all())
    goodput = workload_goodput(workload, now=now)
    flags = _node_flags(workload.cluster, attempts, now)
    recommendations = list(
        workload.recommendations.select_related("node").order_by("-created_at", "-id")[
            : PAGE_RECOMMENDATIONS + 1
        ]
    )
    shown_recommendations = recommendations[:PAGE_RECOMMENDATIONS]
    anomalies = _anomalies(workload, shown_recommendations)
    standings = action_standings(shown_recommendations, attempts, story_events(workload))
    timeline = workload_timeline_figure(workload, now=now, failures=goodput.failures)
    with policies_read_once():
        own_policy = policy_for(workload)
        site = site_policy(workload, own_policy)
    controllers = controllers_of([workload.cluster], now)[workload.cluster.pk]
    return render(
        request,
        "console/workload.html",
        {
            "workload": workload,
            "attempts": attempts,
            "suspect_nodes": flags.suspect,
            "excluded_nodes_until": flags.excluded_until,
            "policy": own_policy,
            "site_policy": site,
            "goodput": _goodput_panel(goodput),
            "anomalies": [
                _anomaly_row(entry)
                for entry in anomalies_in_causal_order(
                    anomalies[:PAGE_ANOMALIES], shown_recommendations, attempts
                )
            ],
            "more_anomalies": len(anomalies) > PAGE_ANOMALIES,
            "page_anomalies": PAGE_ANOMALIES,
            "attempt_rows": [_attempt_row(attempt) for attempt in attempts],
            "recommendations": shown_recommendations,
            "standings": standings,
            "latest_action": latest_action(shown_recommendations, standings),
            "controllers": controllers,
            "wait_warning": controllers.wait_warning,
            "more_recommendations": len(recommendations) > PAGE_RECOMMENDATIONS,
            "page_recommendations": PAGE_RECOMMENDATIONS,
            "trail": workload_trail(workload),
            "timeline": figure_payload(timeline),
            "decision_form": DecisionForm(),
        },
    )


def _anomalies(workload: Workload, recommendations: Sequence[Recommendation]) -> list[Anomaly]:
    """The newest anomalies, one more than a page to know whether there are older ones, and
    any older one a shown recommendation was made on (the root cause it names)."""
    newest = list(
        workload.anomalies.select_related("attempt")
        .prefetch_related("verdicts")
        .order_by("-detected_at", "-id")[: PAGE_ANOMALIES + 1]
    )
    seen = {anomaly.pk for anomaly in newest[:PAGE_ANOMALIES]}
    named = {r.anomaly_id for r in recommendations if r.anomaly_id is not None} - seen
    if not named:
        return newest
    older = list(
        workload.anomalies.filter(pk__in=named)
        .select_related("attempt")
        .prefetch_related("verdicts")
    )
    # The named ones take the place of the oldest on the page, so the page stays as long.
    kept = newest[: max(PAGE_ANOMALIES - len(older), 0)]
    return [*kept, *older, *newest[len(kept) :]]


@dataclass(frozen=True)
class ShortList:
    """A node or rank list written short, with the whole list for its ``title``."""

    text: str
    full: str
    count: int

    @classmethod
    def of_nodes(cls, names: Iterable[object]) -> ShortList:
        ordered = sorted_hostnames(names)
        return cls(compress_hostnames(ordered), ", ".join(ordered), len(ordered))

    @classmethod
    def of_ranks(cls, ranks: Iterable[object]) -> ShortList:
        numbers = sorted({r for r in ranks if isinstance(r, int) and not isinstance(r, bool)})
        return cls(compress_ranks(numbers), ", ".join(map(str, numbers)), len(numbers))


@dataclass(frozen=True)
class AnomalyRow:
    """An anomaly as the page lists it: its place in the failure, its lists written short."""

    a: Anomaly
    role: str
    root_id: int | None
    nodes: ShortList
    ranks: ShortList
    verdict_nodes: dict[int, ShortList]


def _anomaly_row(entry: AnomalyEntry) -> AnomalyRow:
    anomaly = entry.anomaly
    return AnomalyRow(
        a=anomaly,
        role=entry.role,
        root_id=entry.root_id,
        nodes=ShortList.of_nodes(anomaly.implicated_nodes or []),
        ranks=ShortList.of_ranks(anomaly.implicated_ranks or []),
        verdict_nodes={
            verdict.pk: ShortList.of_nodes(verdict.implicated_nodes or [])
            for verdict in anomaly.verdicts.all()
        },
    )


@dataclass(frozen=True)
class AttemptRow:
    """An attempt with its node lists written short."""

    at: Attempt
    nodes: ShortList
    excluded: ShortList


def _attempt_row(attempt: Attempt) -> AttemptRow:
    return AttemptRow(
        at=attempt,
        nodes=ShortList.of_nodes(attempt.nodes or []),
        excluded=ShortList.of_nodes(attempt.excluded_nodes or []),
    )


@dataclass(frozen=True)
class NodeFlags:
    """What recovery knows about an attempt's nodes: suspect (why), excluded (until when)."""

    suspect: dict[str, str]
    excluded_until: dict[str, datetime]


def _node_flags(cluster: Cluster, attempts: Iterable[Attempt], now: datetime) -> NodeFlags:
    """Suspect and currently excluded nodes among the attempts' nodes, in one query."""
    names = {name for attempt in attempts for name in attempt.nodes}
    if not names:
        return NodeFlags({}, {})
    flagged = (
        Node.objects.filter(cluster=cluster, name__in=names)
        .filter(SUSPECT | Node.excluded_at(now))
        .order_by()  # the default order joins the cluster table for nothing
    )
    suspect: dict[str, str] = {}
    excluded: dict[str, datetime] = {}
    for name, suspect_since, health, reason, until in flagged.values_list(
        "name", "suspect_since", "health", "suspect_reason", "excluded_until"
    ):
        if is_suspect(suspect_since, health):
            suspect[name] = reason or (HEALTH_SAYS_SUSPECT if suspect_since is None else "")
        if until is not None and until > now:
            excluded[name] = until
    return NodeFlags(suspect, excluded)


def _goodput_panel(figure: WorkloadGoodput) -> dict[str, Any]:
    failures = figure.failures
    lost = [f.work_lost_s for f in failures if f.work_lost_s is not None]
    return {
        "ettr": figure.ettr,
        "wall_s": figure.wall_s,
        "failures": failures,
        "detection": Distribution.of(f.detection_latency_s for f in failures),
        "action": Distribution.of(f.action_latency_s for f in failures),
        "productive": Distribution.of(f.time_to_productive_s for f in failures),
        "work_lost_total": sum(lost) if lost else None,
    }


@console_view("recovery.view_workload", "Viewing a workload")
def workload_timeline(request: HttpRequest, workload_id: int) -> JsonResponse:
    """The workload page's timeline figure as JSON, for scripts and for redrawing it."""
    workload = get_object_or_404(Workload.objects.select_related("cluster"), pk=workload_id)
    return JsonResponse(figure_payload(workload_timeline_figure(workload)))
