"""What the control plane recorded: the anomalies of each attempt, and the reasons behind each
false action (the recommendation its command carried out, the anomaly that recommendation was
decided on: its evidence line, signature and confirmation).

These functions need Django set up on the run's database.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from bench.soak.accounting import AnomalySeen

# A command is recorded (``dispatched``) just before it runs; the simulator journals it when it
# arrives. A dispatch more than this before the command is another one with the same argv.
DISPATCH_LEAD_S = 120.0


def anomalies_seen(cluster_name: str) -> list[AnomalySeen]:
    from recovery.models import Anomaly

    rows = Anomaly.objects.filter(workload__cluster__name=cluster_name).values_list(
        "workload__job_id", "attempt__number", "kind", "confirmation", "detected_at"
    )
    seen = []
    for job_id, number, kind, confirmation, detected_at in rows:
        if number is None or not str(job_id).isdigit():
            continue
        seen.append(
            AnomalySeen(
                job_id=int(job_id),
                attempt=int(number) - 1,
                kind=str(kind),
                confirmation=str(confirmation or ""),
                detected_at=detected_at.timestamp(),
            )
        )
    return seen


def recorded_actions(cluster_name: str) -> list[tuple[int, int, float]]:
    """(job, the simulator's attempt, time) of every action the control plane recorded as
    carried out, skipped as already done, or a stop that took hold."""
    from recovery.choices import AuditKind
    from recovery.models import AuditEvent

    rows = AuditEvent.objects.filter(
        cluster__name=cluster_name,
        kind__in=[AuditKind.SCHEDULER_ACTION, AuditKind.ACTION_SKIPPED, AuditKind.STOPPED],
    ).values_list("workload__job_id", "attempt", "occurred_at")
    return [
        (int(job_id), int(attempt) - 1, occurred_at.timestamp())
        for job_id, attempt, occurred_at in rows
        if attempt is not None and str(job_id).isdigit()
    ]


class Recorded:
    """The cluster's dispatched commands, to find the recommendation behind a command."""

    def __init__(self, cluster_name: str) -> None:
        from recovery.choices import AuditKind
        from recovery.models import AuditEvent

        self.dispatched: dict[tuple[str, ...], list[tuple[float, dict[str, Any]]]] = {}
        for occurred_at, payload in AuditEvent.objects.filter(
            cluster__name=cluster_name, kind=AuditKind.DISPATCHED
        ).values_list("occurred_at", "payload"):
            argv = tuple(str(part) for part in payload.get("argv") or ())
            self.dispatched.setdefault(argv, []).append((occurred_at.timestamp(), payload))

    def dispatch_of(self, command: dict[str, Any]) -> dict[str, Any] | None:
        """The ``dispatched`` record of a command the simulator received: the latest one with
        its argv recorded before it arrived."""
        at = float(command["at"])
        candidates = [
            (when, payload)
            for when, payload in self.dispatched.get(tuple(command["argv"]), [])
            if at - DISPATCH_LEAD_S <= when <= at + 1.0
        ]
        return max(candidates, key=lambda item: item[0])[1] if candidates else None

    def explain(self, false_action: dict[str, Any]) -> dict[str, Any]:
        """The false action with the recommendation, anomaly and confirmation behind it."""
        from recovery.models import Recommendation

        explained = dict(false_action)
        dispatch = self.dispatch_of(false_action["commands"][0])
        if dispatch is None:
            explained["recommendation"] = None
            explained["dispatched_by"] = "no dispatched record found"
            return explained
        explained["dispatched_by"] = (
            "the watchdog" if dispatch.get("recommendation") is None else "a controller"
        )
        explained["dispatched"] = {
            "action": dispatch.get("action"),
            "sequence": dispatch.get("sequence"),
            "step_reached": dispatch.get("step_reached"),
        }
        if dispatch.get("recommendation") is None:
            explained["recommendation"] = None
            return explained
        recommendation = (
            Recommendation.objects.select_related("anomaly", "attempt")
            .filter(pk=dispatch["recommendation"])
            .first()
        )
        if recommendation is None:
            explained["recommendation"] = {"id": dispatch["recommendation"], "missing": True}
            return explained
        explained["recommendation"] = {
            "id": recommendation.pk,
            "action": recommendation.action,
            "reason": recommendation.reason,
            "excluded_nodes": recommendation.excluded_nodes,
            "exclusion_sources": recommendation.exclusion_sources,
            "status": recommendation.status,
            "decided_by": recommendation.decided_by,
            "attempt": recommendation.attempt.number if recommendation.attempt else None,
            "created_at": _iso(recommendation.created_at),
        }
        anomaly = recommendation.anomaly
        explained["anomaly"] = (
            None
            if anomaly is None
            else {
                "id": anomaly.pk,
                "kind": anomaly.kind,
                "category": anomaly.category,
                "attribution": anomaly.attribution,
                "signature": anomaly.signature,
                "evidence_line": anomaly.evidence_line,
                "evidence_source": anomaly.evidence_source,
                "evidence_at": _iso(anomaly.evidence_at),
                "detected_at": _iso(anomaly.detected_at),
                "confirmation": anomaly.confirmation,
                "confirmation_reason": anomaly.confirmation_reason,
                "implicated_nodes": anomaly.implicated_nodes,
                "stalled_after": (anomaly.details or {}).get("stalled_after"),
            }
        )
        stalled_after = (anomaly.details or {}).get("stalled_after") if anomaly else None
        if stalled_after:
            explained["stalled_after"] = _anomaly_summary(int(stalled_after))
        return explained


def _anomaly_summary(pk: int) -> dict[str, Any] | None:
    from recovery.models import Anomaly

    anomaly = Anomaly.objects.filter(pk=pk).first()
    if anomaly is None:
        return None
    return {
        "id": anomaly.pk,
        "signature": anomaly.signature,
        "evidence_line": anomaly.evidence_line,
        "confirmation": anomaly.confirmation,
        "confirmation_reason": anomaly.confirmation_reason,
        "printed": (anomaly.details or {}).get("printed"),
    }


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None
