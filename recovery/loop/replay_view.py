"""A policy replay as pages show it: the Console's replay page and the admin's preview of an
unsaved policy both render ``templates/console/_replay_report.html`` from these rows (here, not
in ``console/``, because the admin in ``recovery/`` uses them too).

The replay itself (``recovery.loop.replay``) writes nothing; neither does anything here.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone

from recovery.loop.replay import (
    AFTER_DRAFT_STOP,
    DIFFERENT,
    MADE,
    NOT_MADE,
    SAME,
    Action,
    ReplayedDecision,
    ReplayReport,
    Totals,
    replay,
)
from recovery.loop.replay_draft import DraftError, draft_policy
from recovery.loop.replay_output import fate
from recovery.models import Cluster, Policy

# How far back a page replays: a bounded amount of work per request.
DEFAULT_DAYS, MIN_DAYS, MAX_DAYS = 7, 1, 90
# A page's JSON of setting overrides is a few hundred bytes; far more is a mistake.
MAX_OVERRIDES_CHARS = 10_000

# The totals both ways, in the order shown: (key on ``Totals``, words).
TOTALS = (
    ("restarts", "Restarts"),
    ("stops", "Stops"),
    ("drains", "Drains"),
    ("nodes_excluded", "Nodes excluded"),
    ("node_hours_excluded", "Node-hours excluded"),
    ("without_approval", "Carried out without approval"),
)
# A badge class of the Console per verdict: same is fine, a difference wants a look.
VERDICT_CLASSES = {
    SAME: "status-executed",
    DIFFERENT: "status-awaiting_approval",
    MADE: "status-proposed",
    NOT_MADE: "status-proposed",
    AFTER_DRAFT_STOP: "",
}


class DaysError(ValueError):
    """A number of days a page may not replay, in people's words."""


def parse_days(value: object) -> int:
    """Days of history to replay: ``DEFAULT_DAYS`` when not given, else MIN_DAYS to MAX_DAYS."""
    text = str(value).strip() if value is not None else ""
    if not text:
        return DEFAULT_DAYS
    if not (text.isascii() and text.isdigit()) or not MIN_DAYS <= int(text) <= MAX_DAYS:
        raise DaysError(f"Days of history: a whole number from {MIN_DAYS} to {MAX_DAYS}.")
    return int(text)


@dataclass(frozen=True)
class TotalRow:
    key: str
    label: str
    recorded: float | None  # None: a figure of the replay alone
    replayed: float

    @property
    def changed(self) -> bool:
        return self.recorded is not None and self.recorded != self.replayed


@dataclass(frozen=True)
class DecisionRow:
    at: datetime
    workload_id: int
    job_id: str
    attempt: int | None
    kind: str
    recorded: str
    replayed: str
    fate: str  # what became of the recorded recommendation
    verdict: str
    verdict_class: str
    explanation: str


@dataclass(frozen=True)
class ClusterReplay:
    """One cluster's replay: the totals both ways and the decisions that differ."""

    cluster_id: int
    cluster_name: str
    policy: str
    since: datetime
    until: datetime
    decisions: int
    verdicts: list[tuple[str, int]]
    totals: list[TotalRow]
    differences: list[DecisionRow]
    unexplained: int
    with_draft: bool


def words(action: Action | None) -> str:
    return action.words() if action is not None else "nothing"


def _row(decision: ReplayedDecision) -> DecisionRow:
    return DecisionRow(
        at=decision.at,
        workload_id=decision.workload_id,
        job_id=decision.job_id,
        attempt=decision.attempt,
        kind=decision.kind,
        recorded=words(decision.recorded),
        replayed=words(decision.replayed),
        fate=fate(decision),
        verdict=decision.verdict,
        verdict_class=VERDICT_CLASSES.get(decision.verdict, ""),
        explanation=decision.explanation,
    )


def _totals(recorded: Totals, replayed: Totals, report: ReplayReport) -> list[TotalRow]:
    rows = [
        TotalRow(key, label, getattr(recorded, key), getattr(replayed, key))
        for key, label in TOTALS
    ]
    return [
        *rows,
        TotalRow(
            "stops_operators_let_run",
            "Jobs stopped that operators let run",
            None,
            len(report.stops_operators_let_run),
        ),
        TotalRow(
            "rejected_actions_taken",
            "Acts where operators had rejected",
            None,
            len(report.rejected_actions_taken),
        ),
    ]


def shown(report: ReplayReport, cluster: Cluster, *, with_draft: bool) -> ClusterReplay:
    """The rows a page shows of ``report``, a replay of ``cluster``."""
    return ClusterReplay(
        cluster_id=cluster.pk,
        cluster_name=cluster.name,
        policy=report.policy,
        since=report.since,
        until=report.until,
        decisions=len(report.decisions),
        verdicts=sorted(report.verdicts.items(), key=lambda item: (item[0] != SAME, item[0])),
        totals=_totals(report.recorded, report.replayed, report),
        differences=[_row(d) for d in report.differences],
        unexplained=len(report.unexplained),
        with_draft=with_draft,
    )


def replay_days(
    clusters: Sequence[Cluster], days: int, draft: Policy | None, now: datetime | None = None
) -> list[ClusterReplay]:
    """Replay the last ``days`` days of each of ``clusters`` with ``draft`` (None: the policies
    in force). ``draft`` is not changed: the replay is given a copy of it."""
    until = now or timezone.now()
    since = until - timedelta(days=days)
    # A new draft is given a stand-in key by the replay; the caller's instance keeps none.
    tried = copy.copy(draft) if draft is not None else None
    return [
        shown(replay(cluster, since, until, tried), cluster, with_draft=draft is not None)
        for cluster in clusters
    ]


def clusters_covered(policy: Policy) -> list[Cluster]:
    """The clusters a policy's scope reaches: its cluster, or every cluster when it names none."""
    if policy.cluster_id is not None:
        return list(Cluster.objects.filter(pk=policy.cluster_id))
    return list(Cluster.objects.order_by("name"))


def preview_unsaved(draft: Policy, days: int) -> list[ClusterReplay]:
    """The admin's preview: ``draft`` (edited, not saved) over the clusters its scope covers."""
    return replay_days(clusters_covered(draft), days, draft)


def parse_overrides(text: str) -> dict[str, object]:
    """A JSON object of policy settings typed on a page; ``{}`` when empty."""
    if not text.strip():
        return {}
    if len(text) > MAX_OVERRIDES_CHARS:
        raise DraftError(f"the overrides are over {MAX_OVERRIDES_CHARS} characters")
    try:
        fields = json.loads(text)
    except ValueError as exc:
        raise DraftError(f"not JSON: {exc}") from None
    if not isinstance(fields, dict):
        raise DraftError('a JSON object of settings, e.g. {"max_attempts": 20}')
    return fields


def draft_to_try(base: Policy | None, overrides: dict[str, object]) -> Policy | None:
    """The draft a page replays: a saved policy (``base``) with ``overrides`` set, or a new one
    made of ``overrides``; None for the policies in force. A saved policy is tried as if enabled
    unless the overrides say otherwise; nothing is saved."""
    if base is None and not overrides:
        return None
    draft = draft_policy(overrides, base) if overrides else base
    assert draft is not None
    if "enabled" not in overrides:
        draft.enabled = True
    return draft
