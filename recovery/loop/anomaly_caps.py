"""The caps on the anomalies one read may add, and the findings folded past them.

Whatever a job prints, the work of one read is bounded: ``record_anomalies``
(``recovery.loop.anomalies``) asks ``_Caps`` for room before it stores a new anomaly, and a
finding past a cap is folded into one already stored. Apart because it is a bookkeeping of its
own (counts per read and per attempt, the folds, their one event per attempt), with nothing of
attribution or decision in it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db.models import F, Value
from django.db.models.functions import Coalesce, Greatest

from recovery.audit.actors import Actor
from recovery.audit.record import record_event
from recovery.choices import AuditKind
from recovery.detection.findings import Finding
from recovery.models import Anomaly, Attempt, AuditEvent, Workload

# Which cap folded a finding, as the ANOMALIES_FOLDED event names it.
CAP_PER_READ = "per_read"
CAP_PER_ATTEMPT = "per_attempt"
# The ANOMALIES_FOLDED event lists at most this many anomalies and signatures.
MAX_FOLDED_SIGNATURES_SHOWN = 20


def _attempt_key(attempt: Attempt | None) -> int | None:
    return attempt.pk if attempt is not None else None


@dataclass
class _Fold:
    findings: int = 0
    occurrences: int = 0
    last_seen: datetime | None = None
    signatures: set[str] = field(default_factory=set)


@dataclass
class _Caps:
    """The caps on new anomalies, for one read of one workload, and the findings folded.

    A finding past a cap is folded into an anomaly of its attempt: one of the same category
    sharing a node (or, without nodes, one without nodes), else the most recent of its kind,
    else the most recent. The fold adds to that anomaly's ``occurrences`` and
    ``folded_findings`` and moves its ``last_seen_at``; it writes no row and no event of its
    own. The first fold of an attempt writes one ANOMALIES_FOLDED event, so operators know.
    The read's cursor commits with the folds, so a read repeated after a crash re-reads nothing.
    """

    workload: Workload
    per_read: int = field(default_factory=lambda: int(settings.MAX_NEW_ANOMALIES_PER_READ))
    per_attempt: int = field(default_factory=lambda: int(settings.MAX_ANOMALIES_PER_ATTEMPT))
    new: int = 0
    stored: dict[int | None, int] = field(default_factory=dict)
    candidates: dict[int | None, list[Anomaly]] = field(default_factory=dict)
    folds: dict[int, _Fold] = field(default_factory=dict)
    attempts: dict[int | None, Attempt | None] = field(default_factory=dict)
    reached: dict[int | None, str] = field(default_factory=dict)

    def _stored_count(self, attempt: Attempt | None) -> int:
        key = _attempt_key(attempt)
        if key not in self.stored:
            self.stored[key] = Anomaly.objects.filter(
                workload=self.workload, attempt=attempt
            ).count()
        return self.stored[key]

    def room_for_one_more(self, attempt: Attempt | None) -> bool:
        if self.new >= self.per_read:
            self.reached.setdefault(_attempt_key(attempt), CAP_PER_READ)
            return False
        if self._stored_count(attempt) >= self.per_attempt:
            self.reached.setdefault(_attempt_key(attempt), CAP_PER_ATTEMPT)
            return False
        return True

    def counted(self, attempt: Attempt | None, anomaly: Anomaly) -> None:
        key = _attempt_key(attempt)
        self.new += 1
        self.stored[key] = self._stored_count(attempt) + 1
        if key in self.candidates:
            self.candidates[key].insert(0, anomaly)

    def fold(self, attempt: Attempt | None, finding: Finding, now: datetime) -> bool:
        """Fold ``finding`` into an anomaly of its attempt; False when the attempt has none
        (a read's findings about the previous attempt): it is then recorded after all."""
        target = self._target(attempt, finding)
        if target is None:
            return False
        self.attempts[_attempt_key(attempt)] = attempt
        fold = self.folds.setdefault(target.pk, _Fold())
        fold.findings += 1
        fold.occurrences += finding.count
        seen = finding.at or now
        fold.last_seen = seen if fold.last_seen is None else max(fold.last_seen, seen)
        if len(fold.signatures) < MAX_FOLDED_SIGNATURES_SHOWN:
            fold.signatures.add(finding.signature[:128])
        return True

    def _target(self, attempt: Attempt | None, finding: Finding) -> Anomaly | None:
        key = _attempt_key(attempt)
        if key not in self.candidates:
            self.candidates[key] = list(
                Anomaly.objects.filter(workload=self.workload, attempt=attempt)
                .only("id", "kind", "category", "implicated_nodes", "detected_at")
                .order_by("-detected_at", "-id")[: self.per_attempt]
            )
        candidates = self.candidates[key]
        nodes = set(finding.nodes)
        for candidate in candidates:
            if candidate.category != finding.category:
                continue
            shared = set(candidate.implicated_nodes) & nodes
            if shared or (not nodes and not candidate.implicated_nodes):
                return candidate
        same_kind = (c for c in candidates if c.kind == finding.kind)
        return next(same_kind, candidates[0] if candidates else None)

    def apply_folds(self) -> None:
        for pk, fold in self.folds.items():
            seen = fold.last_seen
            Anomaly.objects.filter(pk=pk).update(
                occurrences=F("occurrences") + fold.occurrences,
                folded_findings=F("folded_findings") + fold.findings,
                last_seen_at=Greatest(Coalesce("last_seen_at", "evidence_at"), Value(seen)),
            )
        for key, cap in self.reached.items():
            if key in self.attempts:
                self._announce(self.attempts[key], cap)

    def _announce(self, attempt: Attempt | None, cap: str) -> None:
        """One ANOMALIES_FOLDED event per attempt: later folds only add to the counts."""
        number = attempt.number if attempt is not None else None
        already = AuditEvent.objects.filter(
            workload=self.workload, attempt=number, kind=AuditKind.ANOMALIES_FOLDED
        )
        if already.exists():
            return
        folds = [
            (pk, fold)
            for pk, fold in self.folds.items()
            if any(c.pk == pk for c in self.candidates.get(_attempt_key(attempt), []))
        ]
        record_event(
            cluster=self.workload.cluster,
            workload=self.workload,
            attempt=number,
            kind=AuditKind.ANOMALIES_FOLDED,
            actor=Actor.DETECTOR,
            payload={
                "cap": cap,
                "limit": self.per_read if cap == CAP_PER_READ else self.per_attempt,
                "folded_findings": sum(fold.findings for _, fold in folds),
                "occurrences": sum(fold.occurrences for _, fold in folds),
                "into": sorted(pk for pk, _ in folds)[:MAX_FOLDED_SIGNATURES_SHOWN],
                "signatures": sorted(
                    {signature for _, fold in folds for signature in fold.signatures}
                )[:MAX_FOLDED_SIGNATURES_SHOWN],
            },
        )
