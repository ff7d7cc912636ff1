"""Failures nothing explained: confirmed deaths no signature accounted for, newest first.

The loop records them as anomalies of category ``unexplained`` with the last lines the job
printed (``recovery.loop.monitors.check_job_ending``); the Console lists them so an operator
can teach a pattern from one of those lines (``recovery.loop.teaching``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import QuerySet

from recovery.choices import FailureCategory
from recovery.models import Anomaly


def unexplained_failures(cluster: str = "") -> QuerySet[Anomaly]:
    """Every unexplained failure, of one cluster (by name) when given, newest first."""
    found = Anomaly.objects.filter(category=FailureCategory.UNEXPLAINED)
    if cluster:
        found = found.filter(workload__cluster__name=cluster)
    return found.select_related("workload__cluster", "attempt").order_by("-detected_at", "-id")


@dataclass(frozen=True)
class UnexplainedFailure:
    """One unexplained failure as the Console shows it."""

    anomaly: Anomaly
    exit_code: int | None
    signal: int | None
    lines: list[str]

    @property
    def at(self) -> datetime:
        return self.anomaly.evidence_at


def shown(anomaly: Anomaly) -> UnexplainedFailure:
    details = anomaly.details or {}
    return UnexplainedFailure(
        anomaly=anomaly,
        exit_code=_integer(details.get("exit_code")),
        signal=_integer(details.get("signal")),
        lines=anomaly.last_lines,
    )


def _integer(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
