"""The checklist of a readiness report: docs/deploy.md section 11 as the stored facts show it.

Each item is ``ok`` or ``attention`` from facts stored in the database, or ``unknown`` with what
to check by hand; nothing is ``ok`` by default (``recovery.read.readiness`` builds the report).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import DatabaseError, connection
from django.db.models import Count, Max, Q

from recovery.choices import AuditKind, Disposition, RecommendationAction, RecommendationStatus
from recovery.models import AuditEvent, Cluster, Policy, Recommendation
from recovery.read.controllers import CONTROLLER_SEEN_WITHIN, ago, controllers_of
from recovery.sources.provider_status import AttributionStatus

if TYPE_CHECKING:
    from recovery.read.readiness import Readiness, _Row

# Decided recommendations (approved or rejected) a monitor-mode trial needs before its
# agreement says anything about the policy.
MONITOR_TRIAL_DECISIONS = 20
# Polls run every POLL_SECONDS; three missed rounds is more than a slow poll or a busy worker
# (as the Clusters page counts it).
STALE_AFTER_POLLS = 3
CARRIED_OUT = frozenset({RecommendationStatus.EXECUTED, RecommendationStatus.SKIPPED})


class CheckState(StrEnum):
    OK = "ok"
    ATTENTION = "attention"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class CheckItem:
    """One item of docs/deploy.md section 11, as the stored facts show it."""

    key: str
    title: str
    state: CheckState
    detail: str


@dataclass(frozen=True)
class PolicySettings:
    """The cluster's policy (no partition, the cluster's environment), as read for the report."""

    name: str
    # No enabled policy matches: the built-in defaults apply.
    built_in: bool
    blast_radius_percent: int
    blast_radius_window_minutes: int
    drain_nodes: bool
    max_attempts: int
    max_attempts_without_checkpoint: int
    stop_on_application_fault: bool
    exclusion_hours: int
    decision_timeout_seconds: int
    recommendation_ttl_minutes: int
    divergence_action: str
    straggler_action: str


def cluster_policy(cluster: Cluster) -> PolicySettings:
    """The enabled policy for the whole cluster: its own or every cluster's, for no partition
    and no environment or the cluster's, the most specific; the built-in defaults otherwise."""
    candidates = Policy.objects.filter(
        Q(cluster__isnull=True) | Q(cluster_id=cluster.pk),
        Q(environment="") | Q(environment=cluster.environment),
        enabled=True,
        partition="",
    )
    best = max(candidates, key=lambda p: (p.specificity, bool(p.cluster_id), p.pk), default=None)
    policy = best or Policy(name="built-in defaults")
    return PolicySettings(
        name=policy.name,
        built_in=best is None,
        blast_radius_percent=policy.blast_radius_percent,
        blast_radius_window_minutes=policy.blast_radius_window_minutes,
        drain_nodes=policy.drain_nodes,
        max_attempts=policy.max_attempts,
        max_attempts_without_checkpoint=policy.max_attempts_without_checkpoint,
        stop_on_application_fault=policy.stop_on_application_fault,
        exclusion_hours=policy.exclusion_hours,
        decision_timeout_seconds=policy.decision_timeout_seconds,
        recommendation_ttl_minutes=policy.recommendation_ttl_minutes,
        divergence_action=str(policy.divergence_action),
        straggler_action=str(policy.straggler_action),
    )


# --- the checklist ----------------------------------------------------------------------------


def build_checklist(
    cluster: Cluster,
    report: Readiness,
    rows: Sequence[_Row],
    now: datetime,
    attribution: AttributionStatus,
    since: datetime,
    until: datetime,
) -> list[CheckItem]:
    days = _days_words(since, until)
    ok, attention, unknown = CheckState.OK, CheckState.ATTENTION, CheckState.UNKNOWN
    items = [
        CheckItem(
            "settings",
            "Settings load",
            unknown,
            "Check by hand: `manage.py check --deploy` passes with the production settings and "
            "/api/v1/health/ answers 200.",
        ),
        _scheduler_item(cluster, now),
    ]
    items += _controller_items(cluster, now)
    if cluster.has_canary:
        items.append(
            CheckItem(
                "canary",
                "Partitions allowlist (canary)",
                ok,
                f"Action mode reaches {cluster.action_scope_words()}; the rest of the cluster "
                "stays in monitor mode. The controller's --partitions is not stored: check it "
                "by hand.",
            )
        )
    else:
        items.append(
            CheckItem(
                "canary",
                "Partitions allowlist (canary)",
                attention,
                "No canary: action mode would reach every job. Set canary partitions or a "
                "share of jobs below 100 % to start with part of the cluster.",
            )
        )
    counts = report.counts
    decided = f"{counts.decided} decided ({counts.approved} approved, {counts.rejected} rejected)"
    items.append(
        CheckItem(
            "trial",
            "A monitor-mode trial",
            ok if counts.decided >= MONITOR_TRIAL_DECISIONS else attention,
            f"{decided} in the last {days}; the trial needs at least {MONITOR_TRIAL_DECISIONS}.",
        )
    )
    items.append(_carried_out_item(rows, days))
    items += _policy_items(report.policy)
    items.append(_drain_item(cluster, report.policy))
    items.append(
        CheckItem(
            "slurm_rights",
            "Slurm rights of the controller and the watchdog",
            unknown,
            "Check by hand: the controller's account has AdminLevel Operator (or is root or "
            "SlurmUser), and the control plane's connection account can `scontrol release` and "
            "set ExcNodeList on other users' jobs (section 8).",
        )
    )
    items.append(_hooks_item(cluster, since, until, now, days))
    items.append(_triggers_item())
    items.append(
        CheckItem(
            "backups",
            "Backups tested",
            unknown,
            "Check by hand: a dump restored into a scratch database, with its triggers present.",
        )
    )
    items.append(
        CheckItem(
            "alerting",
            "Alerting on /metrics",
            unknown,
            "Check by hand: alerts on wr_poll_error, wr_controller_seen_seconds, "
            "wr_action_failures_total and the others section 11 lists.",
        )
    )
    items.append(_attribution_item(cluster, attribution, since, until, now))
    items.append(
        CheckItem(
            "on_call",
            "Someone is on call",
            unknown,
            "Check by hand: blast-radius refusals, divergences, drains and jobs opted in with "
            "observe still wait for a person in action mode.",
        )
    )
    items.append(
        CheckItem(
            "way_back",
            "The way back is known",
            unknown,
            "Setting the mode back to monitor, or clearing the acknowledgement, makes new "
            "recommendations wait and stops those the policy made ready; stopping the "
            "controller stops everything. Make sure the people on call know.",
        )
    )
    return items


def _days_words(since: datetime, until: datetime) -> str:
    days = round((until - since).total_seconds() / 86400, 1)
    shown = int(days) if days == int(days) else days
    return f"{shown} day{'' if shown == 1 else 's'}"


def _scheduler_item(cluster: Cluster, now: datetime) -> CheckItem:
    title = "The scheduler reads cleanly"
    by_hand = (
        " Run `manage.py scheduler_check --cluster " + cluster.name + "` for unreadable fields."
    )
    polled_at, failed_at = cluster.last_polled_at, cluster.last_poll_error_at
    if cluster.last_poll_error and (
        polled_at is None or failed_at is None or failed_at > polled_at
    ):
        return CheckItem(
            "scheduler",
            title,
            CheckState.ATTENTION,
            f"The last poll failed: {cluster.last_poll_error[:200]}.",
        )
    if polled_at is None:
        return CheckItem(
            "scheduler", title, CheckState.ATTENTION, "Never polled: is the poller running?"
        )
    stale_after = timedelta(seconds=STALE_AFTER_POLLS * settings.POLL_SECONDS)
    if polled_at < now - stale_after:
        return CheckItem(
            "scheduler",
            title,
            CheckState.ATTENTION,
            f"Polling is late: last poll {ago(polled_at, now)}." + by_hand,
        )
    return CheckItem(
        "scheduler",
        title,
        CheckState.OK,
        f"Last polled {ago(polled_at, now)} without error." + by_hand,
    )


def _controller_items(cluster: Cluster, now: datetime) -> list[CheckItem]:
    seen = controllers_of([cluster], now)[cluster.pk]
    minutes = int(CONTROLLER_SEEN_WITHIN.total_seconds() // 60)
    names = ", ".join(c.name for c in seen.controllers[:5])
    if seen.controllers:
        tokens = CheckItem(
            "controller_tokens",
            "Controller tokens scoped to this cluster",
            CheckState.OK,
            f"{len(seen.controllers)} unrevoked token{'s' if len(seen.controllers) > 1 else ''} "
            f"({names}), each valid for {cluster.name} only. Check the controller's identity "
            "line in its output by hand.",
        )
    else:
        tokens = CheckItem(
            "controller_tokens",
            "Controller tokens scoped to this cluster",
            CheckState.ATTENTION,
            f"No unrevoked controller token is issued for {cluster.name}.",
        )
    if seen.recent:
        last = seen.last_seen
        when = ago(last, now) if last else ""
        calling = CheckItem(
            "controller_seen",
            f"A controller called in within {minutes} minutes",
            CheckState.OK,
            f"Last call {when}.",
        )
    else:
        calling = CheckItem(
            "controller_seen",
            f"A controller called in within {minutes} minutes",
            CheckState.ATTENTION,
            seen.wait_warning,
        )
    return [tokens, calling]


def _carried_out_item(rows: Sequence[_Row], days: str) -> CheckItem:
    title = "Approved recommendations carried out"
    approved = [r for r in rows if r.approved_by]
    carried = sum(r.status in CARRIED_OUT for r in approved)
    failed = sum(r.status == RecommendationStatus.FAILED for r in approved)
    abandoned = sum(r.disposition == Disposition.ABANDONED for r in approved)
    converged = sum(r.disposition == Disposition.CONVERGED for r in approved)
    figures = (
        f"Of {len(approved)} approved in the last {days}: {carried} carried out, "
        f"{converged} converged, {failed} failed, {abandoned} abandoned."
    )
    if failed or abandoned:
        return CheckItem("carried_out", title, CheckState.ATTENTION, figures)
    if not carried:
        return CheckItem(
            "carried_out",
            title,
            CheckState.ATTENTION,
            figures + " Nothing approved was carried out yet: the controller's Slurm rights "
            "are unproven.",
        )
    return CheckItem("carried_out", title, CheckState.OK, figures)


def _policy_items(policy: PolicySettings) -> list[CheckItem]:
    source = (
        "No enabled policy matches the whole cluster: the built-in defaults apply"
        if policy.built_in
        else f"Policy {policy.name}"
    )
    radius = (
        f"{policy.blast_radius_percent} % of the cluster over "
        f"{policy.blast_radius_window_minutes} minutes"
    )
    if policy.built_in:
        blast = CheckItem(
            "blast_radius",
            "Blast radius",
            CheckState.ATTENTION,
            f"{source} ({radius}): write the cluster's policy and agree its values.",
        )
    elif policy.blast_radius_percent >= 100:
        blast = CheckItem(
            "blast_radius",
            "Blast radius",
            CheckState.ATTENTION,
            f"{source}: {radius}, which guards nothing.",
        )
    else:
        blast = CheckItem(
            "blast_radius",
            "Blast radius",
            CheckState.OK,
            f"{source}: at most {radius} is excluded, restarted or drained before a person "
            "decides.",
        )
    rules = CheckItem(
        "stop_rules",
        "Retry budgets and stop rules",
        CheckState.UNKNOWN,
        f"{source}: max_attempts {policy.max_attempts}, without a checkpoint "
        f"{policy.max_attempts_without_checkpoint}, stop on application fault "
        f"{'on' if policy.stop_on_application_fault else 'off'}, exclusion "
        f"{policy.exclusion_hours} h, decision timeout {policy.decision_timeout_seconds} s, "
        f"TTL {policy.recommendation_ttl_minutes} min, divergence {policy.divergence_action}, "
        f"straggler {policy.straggler_action}. Read and agree them by hand.",
    )
    return [blast, rules]


def _drain_item(cluster: Cluster, policy: PolicySettings) -> CheckItem:
    title = "Drains"
    by_hand = Recommendation.objects.filter(
        workload__cluster_id=cluster.pk, action=RecommendationAction.DRAIN
    ).exclude(approved_by="")
    approved = by_hand.count()
    recommends = (
        "the policy recommends drains"
        if policy.drain_nodes
        else "the policy recommends no drains (drain_nodes off)"
    )
    if not cluster.drain_automatically:
        return CheckItem(
            "drains",
            title,
            CheckState.OK,
            f"drain_automatically is off: every drain waits for an operator; {recommends}; "
            f"{approved} drain{'s' if approved != 1 else ''} approved by hand so far.",
        )
    if not approved:
        return CheckItem(
            "drains",
            title,
            CheckState.ATTENTION,
            "drain_automatically is on, but no drain has been approved by hand yet: turn it "
            f"off until drains have been approved for a while; {recommends}.",
        )
    return CheckItem(
        "drains",
        title,
        CheckState.OK,
        f"drain_automatically is on after {approved} drain{'s' if approved != 1 else ''} "
        f"approved by hand; {recommends}.",
    )


def _hooks_item(
    cluster: Cluster, since: datetime, until: datetime, now: datetime, days: str
) -> CheckItem:
    title = "Scheduler hooks installed"
    hooks = AuditEvent.objects.filter(
        cluster_id=cluster.pk,
        kind=AuditKind.SCHEDULER_HOOK,
        occurred_at__gte=since,
        occurred_at__lt=until,
    ).aggregate(n=Count("id"), last=Max("occurred_at"))
    if hooks["n"]:
        return CheckItem(
            "hooks",
            title,
            CheckState.OK,
            f"{hooks['n']} scheduler_hook event{'s' if hooks['n'] != 1 else ''} in the last "
            f"{days}, the latest {ago(hooks['last'], now)}.",
        )
    return CheckItem(
        "hooks",
        title,
        CheckState.ATTENTION,
        f"No scheduler_hook event in the last {days}: check `strigger --get --node --down` "
        "lists node-down.sh and EpilogSlurmctld is set.",
    )


# The append-only triggers migration 0002 creates on MySQL and MariaDB.
_TRIGGER_OPERATIONS = frozenset({"UPDATE", "DELETE"})


def _triggers_item() -> CheckItem:
    title = "Audit trail triggers present"
    grants = " Check by hand that the runtime account has no DROP (SHOW GRANTS)."
    if connection.vendor != "mysql":
        return CheckItem(
            "audit_triggers",
            title,
            CheckState.UNKNOWN,
            f"The database is {connection.vendor}: the triggers exist on MySQL and MariaDB only."
            + grants,
        )
    table = AuditEvent._meta.db_table
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT EVENT_MANIPULATION FROM information_schema.TRIGGERS "
                "WHERE TRIGGER_SCHEMA = DATABASE() AND EVENT_OBJECT_TABLE = %s",
                [table],
            )
            found = {str(row[0]).upper() for row in cursor.fetchall()}
    except DatabaseError as exc:
        return CheckItem(
            "audit_triggers", title, CheckState.UNKNOWN, f"Could not read them: {exc}." + grants
        )
    missing = sorted(_TRIGGER_OPERATIONS - found)
    if missing:
        return CheckItem(
            "audit_triggers",
            title,
            CheckState.ATTENTION,
            f"No trigger refuses {' or '.join(missing)} on {table}." + grants,
        )
    return CheckItem(
        "audit_triggers",
        title,
        CheckState.OK,
        f"UPDATE and DELETE on {table} are refused by triggers." + grants,
    )


def _attribution_item(
    cluster: Cluster,
    status: AttributionStatus,
    since: datetime,
    until: datetime,
    now: datetime,
) -> CheckItem:
    title = "Attribution"
    degraded = (
        AuditEvent.objects.filter(
            cluster_id=cluster.pk,
            kind=AuditKind.ATTRIBUTION_DEGRADED,
            occurred_at__gte=since,
            occurred_at__lt=until,
        )
        .order_by("-occurred_at")
        .values_list("occurred_at", flat=True)
        .first()
    )
    if status.degraded:
        if not status.configured:
            detail = (
                "No external attribution provider: failures are attributed by built-in rules "
                "only. Configure WR_ATTRIBUTION_URL, or record that built-in rules are accepted."
            )
        else:
            detail = (
                f"Provider {status.provider} is failing ({status.reason}): built-in rules only."
            )
        return CheckItem("attribution", title, CheckState.ATTENTION, detail)
    if degraded is not None:
        return CheckItem(
            "attribution",
            title,
            CheckState.ATTENTION,
            f"Provider {status.provider} answers now, but was unavailable {ago(degraded, now)}.",
        )
    return CheckItem(
        "attribution",
        title,
        CheckState.OK,
        f"Provider {status.provider}: {status.reason}; not degraded in the window.",
    )
