"""Attribution: which layer is to blame for an anomaly, and how sure we are.

The built-in rules start from the detector's evidence (its category and default attribution)
and add what the scheduler knows: hardware evidence that names a node is firm, a category
whose default is "unknown" stays unsure. Without an external provider the system runs in
degraded mode, and every verdict says so.
"""

from __future__ import annotations

from django.db import transaction

from recovery.audit import record_event
from recovery.choices import AuditKind
from recovery.models import Anomaly, Verdict

ATTRIBUTOR = "attribution:builtin"


def builtin_confidence(anomaly: Anomaly) -> float:
    if anomaly.attribution == "unknown":
        return 0.4
    if anomaly.attribution == "hardware" and anomaly.implicated_nodes:
        return 0.9
    if anomaly.details.get("role") == "wrapper":
        return 0.5
    return 0.75


def attribute(anomaly: Anomaly) -> Verdict:
    """Record the built-in verdict for ``anomaly`` (once) and its audit event."""
    with transaction.atomic():
        existing = anomaly.verdicts.filter(provider=Verdict.BUILTIN_PROVIDER).first()
        if existing is not None:
            return existing
        verdict = Verdict.objects.create(
            anomaly=anomaly,
            provider=Verdict.BUILTIN_PROVIDER,
            attribution=anomaly.attribution,
            confidence=builtin_confidence(anomaly),
            implicated_nodes=anomaly.implicated_nodes,
            detail={"rule": f"{anomaly.signature or anomaly.kind} → {anomaly.attribution}"},
        )
        workload = anomaly.workload
        record_event(
            cluster=workload.cluster,
            workload=workload,
            attempt=anomaly.attempt.number if anomaly.attempt else None,
            kind=AuditKind.ATTRIBUTED,
            actor=ATTRIBUTOR,
            payload={
                "anomaly": anomaly.pk,
                "attribution": verdict.attribution,
                "confidence": verdict.confidence,
                "nodes": verdict.implicated_nodes,
                "provider": verdict.provider,
                # No external provider is configured yet: built-in rules only.
                "degraded": True,
            },
        )
    return verdict
