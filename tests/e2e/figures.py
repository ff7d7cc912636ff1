"""A scenario's figures: the latencies and actions of its report row, and the report itself.

Every scenario records one row in ``var/e2e/report.json`` (``WR_E2E_REPORT`` moves it), written
at the end of the session and printed by ``tests/e2e/report.py``.
"""

from __future__ import annotations

import fcntl
import json
import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from recovery.choices import AuditKind, Confirmation, RecommendationStatus
from recovery.models import Anomaly, AuditEvent, Recommendation, Workload
from tests.e2e.job import Injection
from tests.e2e.loop import POLL_SECONDS
from tests.slurm_fixtures import REPO

REPORT = Path(os.environ.get("WR_E2E_REPORT", str(REPO / "var" / "e2e" / "report.json")))


class Report:
    """Rows of figures, one per scenario, written as JSON when the session ends."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def write(self, path: Path) -> None:
        """Write the rows, beside those that other test workers of the same run wrote there
        (each Slurm cluster's scenarios run in a worker of their own); a file of an earlier
        run is replaced."""
        path.parent.mkdir(parents=True, exist_ok=True)
        run = os.environ.get("PYTEST_XDIST_TESTRUNUID", "")
        marker = path.with_name(path.name + ".run")
        with path.with_name(path.name + ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            rows = list(self.rows)
            if run and marker.exists() and marker.read_text() == run and path.exists():
                mine = {(row["scenario"], row.get("slurm")) for row in rows}
                rows += [
                    row
                    for row in json.loads(path.read_text())
                    if (row["scenario"], row.get("slurm")) not in mine
                ]
            rows.sort(key=lambda row: str(row.get("slurm")))  # stable: run order within
            partial = path.with_suffix(".tmp")
            partial.write_text(json.dumps(rows, indent=2, default=str) + "\n")
            partial.replace(path)
            marker.write_text(run)


def scenario_figures(
    workload: Workload | None, injection: Injection | None, *, anomaly_kind: str | None = None
) -> dict[str, Any]:
    """The report row's figures, from the audit trail and the anomaly rows.

    A crash read from a log is only a suspect until the process is seen to end, so two
    latencies are kept: ``suspect_latency_s``, from the injection to the first anomaly of
    any kind, and ``detection_latency_s``, to the moment the loop had an anomaly it may act
    on (of ``anomaly_kind`` when given): a confirmed one when it was confirmed, one that needs
    no confirmation (a hang, a straggler) when it was recorded. ``action_latency_s`` runs
    from that moment to the first scheduler action.
    """
    if workload is None or injection is None:
        return {}
    # A poll that began just before the injection may record what the fault printed.
    since = injection.at - timedelta(seconds=2 * POLL_SECONDS)
    recent = Anomaly.objects.filter(workload=workload, detected_at__gte=since)
    anomalies = recent.filter(kind=anomaly_kind) if anomaly_kind else recent
    suspect = recent.order_by("detected_at", "pk").first()
    first = anomalies.order_by("detected_at", "pk").first()
    actionable = min((at for at in map(actionable_at, anomalies) if at is not None), default=None)
    events = AuditEvent.objects.filter(workload=workload).order_by("occurred_at", "pk")
    actions = list(events.filter(kind=AuditKind.SCHEDULER_ACTION))
    checkpoint = (
        events.filter(kind=AuditKind.CHECKPOINT_SAVED, attempt__gt=injection.attempt)
        .order_by("occurred_at", "pk")
        .first()
    )
    recommendations = list(
        Recommendation.objects.filter(workload=workload).order_by("created_at", "pk")
    )
    acted = [
        r
        for r in recommendations
        if r.status in {RecommendationStatus.EXECUTED, RecommendationStatus.SKIPPED}
    ]
    basis = next((r.anomaly for r in acted if r.anomaly is not None), None) or next(
        (r.anomaly for r in recommendations if r.anomaly is not None), None
    )
    action_after = [a for a in actions if actionable is not None and a.occurred_at >= since]
    per_recommendation: dict[Any, int] = {}
    for action in actions:
        key = action.payload.get("recommendation")
        per_recommendation[key] = per_recommendation.get(key, 0) + 1

    def after_injection(at: datetime | None) -> float | None:
        if at is None:
            return None
        return round(max(0.0, (at - injection.at).total_seconds()), 2)

    figures: dict[str, Any] = {
        "suspect_latency_s": after_injection(suspect.detected_at if suspect else None),
        "detection_latency_s": after_injection(actionable),
        "action_latency_s": None
        if actionable is None or not action_after
        else round((action_after[0].occurred_at - actionable).total_seconds(), 2),
        "time_to_new_checkpoint_s": None
        if checkpoint is None
        else round((checkpoint.occurred_at - injection.at).total_seconds(), 2),
        "attribution": chosen.attribution if (chosen := basis or first) else None,
        "acted_on": None
        if basis is None
        else {"kind": basis.kind, "confirmation": basis.confirmation},
        "scheduler_actions": len(actions),
        "duplicate_actions": sum(n - 1 for n in per_recommendation.values()),
    }
    node = injection.detail.get("node")
    if node:
        implicating = next(
            (a for a in anomalies.order_by("detected_at", "pk") if node in a.implicated_nodes),
            None,
        )
        figures["node_implicated_after_s"] = (
            None
            if implicating is None
            else round((implicating.detected_at - injection.at).total_seconds(), 2)
        )
    figures["details"] = {
        "fault": injection.detail,
        "anomalies": [
            {
                "kind": a.kind,
                "category": a.category,
                "attribution": a.attribution,
                "signature": a.signature,
                "nodes": a.implicated_nodes,
                "ranks": a.implicated_ranks,
                "attempt": a.attempt.number if a.attempt else None,
                "after_injection_s": round((a.detected_at - injection.at).total_seconds(), 2),
                "confirmation": a.confirmation,
                "confirmed_after_s": None
                if a.confirmation_at is None
                else round((a.confirmation_at - injection.at).total_seconds(), 2),
                "confirmation_reason": a.confirmation_reason[:200],
                "evidence": a.evidence_line[:200],
            }
            for a in Anomaly.objects.filter(workload=workload).order_by("detected_at", "pk")
        ],
        "recommendations": [
            {
                "id": r.pk,
                "action": r.action,
                "status": r.status,
                "excluded_nodes": r.excluded_nodes,
                "reason": r.reason[:300],
                "anomaly": r.anomaly_id,
            }
            for r in recommendations
        ],
        "events": [
            {
                "t": round((e.occurred_at - injection.at).total_seconds(), 2),
                "attempt": e.attempt,
                "kind": e.kind,
                "actor": e.actor,
                "summary": _summary(e),
            }
            for e in events
            if e.kind not in {AuditKind.CHECKPOINT_SAVED}
            or e.attempt is None
            or e.attempt > injection.attempt
        ][:80],
    }
    return figures


def actionable_at(anomaly: Anomaly) -> datetime | None:
    """When the loop could act on ``anomaly``: a crash once it was confirmed (never while only
    suspected, nor when it was survived or stalled), an anomaly that needs no confirmation (a
    hang, a straggler) once recorded."""
    if anomaly.confirmation == Confirmation.CONFIRMED:
        return anomaly.confirmation_at or anomaly.detected_at
    if not anomaly.confirmation:
        return anomaly.detected_at
    return None


def _summary(event: AuditEvent) -> str:
    payload = event.payload or {}
    if event.kind == AuditKind.SCHEDULER_ACTION:
        commands = " ; ".join(" ".join(c.get("argv", [])[:3]) for c in payload.get("commands", []))
        return f"{payload.get('action')} {payload.get('excluded_nodes')}: {commands}"
    keys = ("to", "category", "attribution", "nodes", "action", "excluded_nodes", "step", "reason")
    return ", ".join(f"{k}={payload[k]}" for k in keys if k in payload)[:300]
