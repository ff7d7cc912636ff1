"""The loop's central step: what one read found becomes anomalies, attributed and decided on.

``record_read`` records one read of a job's output, whichever way it came (the output file,
``recovery.loop.logs``; a log store, ``recovery.loop.log_stores``; lines a job pushed,
``recovery.loop.push``): its progress and checkpoints first, then its findings.
``record_findings`` picks the causes among the findings, and ``record_anomalies`` stores each
once, attributes it (``recovery.loop.attribution``), flags suspect nodes
(``recovery.loop.suspects``) and lets the policy decide (``recovery.loop.policy``). The monitors
and GPU checks record what they find through ``record_anomalies`` too, so every signal family
takes the same path.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

from django.utils import timezone

from recovery.audit.actors import Actor
from recovery.audit.record import record_event
from recovery.choices import AuditKind, Confirmation, Severity
from recovery.detection.findings import Finding
from recovery.detection.scanner import ScanResult
from recovery.detection.signatures.base import GENERIC_EXCEPTION, SignatureRole
from recovery.loop.attribution import attribute
from recovery.loop.confirmation import (
    NO_CONFIRMATION,
    FirstLook,
    ReadContext,
    first_look,
    last_sample_id,
    record_settled,
)
from recovery.loop.policy import decide_when_ready
from recovery.loop.suspects import flag_suspect_nodes
from recovery.models import Anomaly, Attempt, AuditEvent, ProgressSample, Workload
from recovery.sources.schedulers.validation import MAX_NODE_NAME_LENGTH, name_problem, shown

# Detector details worth keeping on the anomaly (hang and straggler figures, job state facts).
KEPT_DETAIL = frozenset(
    {
        "last_step",
        "silent_seconds",
        "allowed_seconds",
        "median_step_seconds",
        "ratio",
        "member_median",
        "peer_median",
        "metric",
        "state",
        "exit_code",
        "signal",
        "reason",
        "reports_exit",
        "stalled_after",
    }
)
MAX_EXCERPT = 4000
# How long after an attempt ended a node's failure still counts as evidence about it, and how
# long after a controller's restart Slurm's requeue notice is still its echo.
RECENT_END = timedelta(minutes=10)
# Progress samples older than this are dropped: the longest window a detector reads.
SAMPLE_RETENTION = timedelta(hours=2)


def record_read(workload: Workload, result: ScanResult, now: datetime) -> tuple[int, int]:
    """Record one read of a job's output: its progress first, then its findings.

    Progress goes first so that a crash line followed by further steps in the same read is
    recorded as survived, and the steps after it in later reads are told from those before.
    Returns the anomalies created and the checkpoints recorded.
    """
    attempt = attempt_writing(workload)
    samples_before = last_sample_id(workload)
    saved = record_progress(workload, attempt, result, now)
    created = record_findings(workload, attempt, result, now, samples_before=samples_before)
    return created, saved


def attempt_writing(workload: Workload) -> Attempt | None:
    """The attempt whose output is being read now.

    Until a requeued job starts again, what it prints is the previous attempt shutting down
    (Slurm's cancel notices, srun's last words): it belongs to that attempt, not to the next.
    """
    attempts = list(
        Attempt.objects.filter(workload=workload, number__lte=workload.current_attempt).order_by(
            "-number"
        )[:2]
    )
    if not attempts:
        return None
    current = attempts[0]
    if current.started_at is None and len(attempts) > 1:
        return attempts[1]
    return current


def _fingerprint(finding: Finding, scope: str) -> str:
    key = f"{scope}|{finding.signature}|{finding.detail.get('xid', '')}|{finding.category}"
    if finding.signature == GENERIC_EXCEPTION:
        key += "|" + finding.evidence[:120]
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def record_findings(
    workload: Workload,
    attempt: Attempt | None,
    result: ScanResult,
    now: datetime,
    scope: str = "",
    *,
    samples_before: int | None = None,
) -> int:
    """Record the read's findings; ``scope`` separates sources (a node's kernel log).

    ``samples_before`` is the workload's last progress sample before the read's own were
    stored (see ``record_read``).
    """
    # Causes become anomalies; symptoms and wrappers (collective timeouts, "a child failed")
    # only when nothing better explains the read, and otherwise ride along as secondary.
    failures = [f for f in result.findings if f.severity != Severity.WARNING]
    if failures and _requeued_by_us(workload, now):
        failures = [f for f in failures if not _is_requeue_notice(f)]
    if failures and attempt is not None and _acted_on(workload, attempt):
        # srun and slurmstepd reporting the steps our own restart stopped: not a new failure.
        failures = [f for f in failures if not f.detail.get("reports_exit")]
    causes = [f for f in failures if f.detail.get("role") == SignatureRole.CAUSE]
    recorded = causes or failures[:1]
    secondary = [
        {"signature": f.signature, "category": f.category, "count": f.count}
        for f in result.findings
        if f not in recorded
    ]
    samples_after = last_sample_id(workload)
    read = ReadContext(
        progress=result.progress,
        exits=[f for f in failures if f.detail.get("reports_exit")],
        samples_before=samples_after if samples_before is None else samples_before,
        samples_after=samples_after,
    )
    created = record_anomalies(
        workload, attempt, recorded, now, scope=scope, secondary=secondary, read=read
    )
    return len(created)


def attempt_with_nodes(
    workload: Workload, attempt: Attempt | None, nodes: list[str]
) -> Attempt | None:
    """The attempt evidence naming ``nodes`` is about: the previous one when only it ran there.

    A node failure reported while the job already runs again elsewhere (Slurm requeued it
    itself) belongs to the allocation that lost the node.
    """
    if attempt is None or not nodes or not attempt.nodes or set(nodes) & set(attempt.nodes):
        return attempt
    previous = Attempt.objects.filter(workload=workload, number=attempt.number - 1).first()
    if previous is not None and set(nodes) & set(previous.nodes):
        return previous
    return attempt


def _is_requeue_notice(finding: Finding) -> bool:
    return finding.signature == "slurm-preempted" and "REQUEUE" in finding.evidence.upper()


def _requeued_by_us(workload: Workload, now: datetime) -> bool:
    """Whether a controller restarted the workload lately: Slurm's "CANCELLED ... DUE TO JOB
    REQUEUE" line is then the echo of that restart, not a new failure (and, read after the
    restart, it would otherwise count against the new attempt)."""
    return AuditEvent.objects.filter(
        workload=workload,
        kind=AuditKind.SCHEDULER_ACTION,
        occurred_at__gte=now - RECENT_END,
    ).exists()


def _acted_on(workload: Workload, attempt: Attempt) -> bool:
    """Whether a controller already restarted or stopped ``attempt``."""
    return AuditEvent.objects.filter(
        workload=workload, attempt=attempt.number, kind=AuditKind.SCHEDULER_ACTION
    ).exists()


def record_anomalies(
    workload: Workload,
    attempt: Attempt | None,
    findings: list[Finding],
    now: datetime,
    *,
    scope: str = "",
    secondary: list[dict[str, object]] | None = None,
    read: ReadContext | None = None,
) -> list[Anomaly]:
    """Store each finding as an anomaly once, then attribute it and let the policy decide.

    A crash the job printed itself is recorded as suspected unless ``read`` (the rest of the
    same read) already settles it; see ``recovery.loop.confirmation``. A finding seen again (a
    re-read, a repeated poll) only adds to the stored anomaly's count, ranks and nodes, except
    that a crash survived before is suspected again. Returns the anomalies created now.
    """
    created_anomalies: list[Anomaly] = []
    to_decide: list[Anomaly] = []
    for finding in findings:
        ignored_nodes = _drop_invalid_node_names(finding)
        attempt_of_finding = attempt_with_nodes(workload, attempt, finding.nodes)
        look = first_look(finding, scope, attempt_of_finding, read, now)
        # The moment it is recorded, not the poll's start: a long poll must not make detection
        # look faster than it was.
        recorded_at = timezone.now()
        settled = look.confirmation not in (NO_CONFIRMATION, Confirmation.SUSPECTED)
        anomaly, created = Anomaly.objects.get_or_create(
            workload=workload,
            attempt=attempt_of_finding,
            fingerprint=_fingerprint(finding, scope),
            defaults={
                "kind": finding.kind,
                "category": finding.category,
                "attribution": finding.attribution,
                "severity": finding.severity,
                "signature": finding.signature[:128],
                "evidence_line": finding.evidence,
                "evidence_excerpt": str(finding.detail.get("excerpt", ""))[:MAX_EXCERPT],
                "implicated_nodes": finding.nodes,
                "implicated_ranks": finding.ranks,
                "occurrences": finding.count,
                "details": {
                    "role": finding.detail.get("role"),
                    "xid": finding.detail.get("xid"),
                    "source": finding.source,
                    "secondary": (secondary or [])[:20],
                    **({"ignored_nodes": ignored_nodes} if ignored_nodes else {}),
                    **({"suspect": look.suspect} if look.suspect else {}),
                    **{k: v for k, v in finding.detail.items() if k in KEPT_DETAIL},
                },
                "evidence_at": finding.at or now,
                "detected_at": recorded_at,
                "confirmation": look.confirmation,
                "confirmation_at": recorded_at if settled else None,
                "confirmation_reason": look.reason[:255],
            },
        )
        if not created:
            anomaly.occurrences += finding.count
            anomaly.implicated_nodes = sorted(set(anomaly.implicated_nodes) | set(finding.nodes))
            anomaly.implicated_ranks = sorted(set(anomaly.implicated_ranks) | set(finding.ranks))
            anomaly.save(update_fields=["occurrences", "implicated_nodes", "implicated_ranks"])
            if anomaly.confirmation == Confirmation.SURVIVED and look.suspect is not None:
                _suspect_again(anomaly, finding, look, recorded_at)
                to_decide.append(anomaly)
            continue
        created_anomalies.append(anomaly)
        to_decide.append(anomaly)
        _record_detected(anomaly, finding, ignored_nodes, anomaly.detected_at)
        if look.settled_from_suspicion:
            record_settled(anomaly)
    for anomaly in to_decide:
        # Detect, attribute, decide: a confirmed cause is decided in the same transaction, so
        # it never lacks its recommendation; a suspect waits for its confirmation, a symptom
        # may wait for its cause.
        if anomaly in created_anomalies:
            attribute(anomaly)
            flag_suspect_nodes(anomaly, now)
        decide_when_ready(anomaly, now)
    return created_anomalies


def _record_detected(
    anomaly: Anomaly,
    finding: Finding,
    ignored_nodes: list[dict[str, str]],
    detected_at: datetime,
    *,
    again: bool = False,
) -> None:
    workload = anomaly.workload
    record_event(
        cluster=workload.cluster,
        workload=workload,
        attempt=anomaly.attempt.number if anomaly.attempt else None,
        kind=AuditKind.DETECTED,
        actor=Actor.DETECTOR,
        payload={
            "anomaly": anomaly.pk,
            "kind": anomaly.kind,
            "category": anomaly.category,
            "attribution": anomaly.attribution,
            "signature": anomaly.signature,
            "evidence": anomaly.evidence_line[:500],
            "count": finding.count,
            "nodes": finding.nodes[:32],
            "ranks": finding.ranks[:64],
            "evidence_at": anomaly.evidence_at.isoformat(),
            "confirmation": anomaly.confirmation,
            **({"again": True} if again else {}),
            **({"ignored_nodes": ignored_nodes} if ignored_nodes else {}),
        },
        # The detection's own time: a confirmation made in the same read (stamped with that
        # time too, and written after) follows it in the trail.
        occurred_at=detected_at,
    )


def _suspect_again(
    anomaly: Anomaly, finding: Finding, look: FirstLook, recorded_at: datetime
) -> None:
    """A crash the job survived before was printed again: this time it may be the last words."""
    settled = look.confirmation != Confirmation.SUSPECTED
    anomaly.details = {**anomaly.details, "suspect": look.suspect}
    anomaly.confirmation = look.confirmation
    anomaly.confirmation_at = recorded_at if settled else None
    anomaly.confirmation_reason = look.reason[:255]
    anomaly.decided_at = None
    anomaly.save(
        update_fields=[
            "details",
            "confirmation",
            "confirmation_at",
            "confirmation_reason",
            "decided_at",
        ]
    )
    _record_detected(anomaly, finding, [], recorded_at, again=True)
    if settled:
        record_settled(anomaly)


# At most this many ignored names are kept with an anomaly; the rest are only counted.
MAX_IGNORED_NODES = 10


def _drop_invalid_node_names(finding: Finding) -> list[dict[str, str]]:
    """Keep only node names Slurm could have given; return the others with why they were ignored.

    Node names in evidence come from what a job printed (``-h``, ``gpu$(id)``, a 100-character
    word): one of them in a recommendation would reach ``scontrol`` as an argument.
    """
    kept: list[str] = []
    ignored: list[dict[str, str]] = []
    for name in finding.nodes:
        problem = name_problem(name, max_length=MAX_NODE_NAME_LENGTH)
        if problem is None:
            kept.append(name)
        elif len(ignored) < MAX_IGNORED_NODES:
            ignored.append({"value": shown(name), "reason": f"not a node name: it {problem}"})
    if len(finding.nodes) - len(kept) > len(ignored):
        ignored.append(
            {"value": "…", "reason": f"{len(finding.nodes) - len(kept) - len(ignored)} more"}
        )
    finding.nodes = kept
    return ignored


def record_progress(
    workload: Workload, attempt: Attempt | None, result: ScanResult, now: datetime
) -> int:
    number = attempt.number if attempt else None
    if number:
        record_progress_samples(workload, number, result, now)
    if result.progress:
        latest = result.progress[-1]
        if number and number > 1 and not _has_event(workload, number, AuditKind.PROGRESS_RESUMED):
            first = result.progress[0]
            record_event(
                cluster=workload.cluster,
                workload=workload,
                attempt=number,
                kind=AuditKind.PROGRESS_RESUMED,
                actor=Actor.DETECTOR,
                payload={"step": first.step},
                occurred_at=first.at or now,
            )
        workload.last_progress_step = latest.step
        workload.last_progress_at = latest.at or now
    saved = 0
    for checkpoint in result.checkpoints:
        if not checkpoint.completed:
            continue
        step = checkpoint.step
        last = workload.last_checkpoint_step
        if step is not None and last is not None and step <= last:
            continue  # already recorded (or an older one seen again)
        saved += 1
        workload.last_checkpoint_step = step
        workload.last_checkpoint_at = checkpoint.at or now
        record_event(
            cluster=workload.cluster,
            workload=workload,
            attempt=number,
            kind=AuditKind.CHECKPOINT_SAVED,
            actor=Actor.DETECTOR,
            payload={"step": step, "path": checkpoint.path},
            occurred_at=checkpoint.at or now,
        )
    if saved and attempt is not None and not attempt.produced_checkpoint:
        attempt.produced_checkpoint = True
        attempt.save(update_fields=["produced_checkpoint"])
    workload.save(
        update_fields=[
            "last_progress_step",
            "last_progress_at",
            "last_checkpoint_step",
            "last_checkpoint_at",
            "updated_at",
        ]
    )
    return saved


def record_progress_samples(
    workload: Workload, attempt: int, result: ScanResult, now: datetime
) -> int:
    """Keep the read's progress points (per rank and node) for the hang and straggler checks."""
    samples = [
        ProgressSample(
            workload=workload,
            attempt=attempt,
            rank=point.rank,
            node=(point.node or "")[:128],
            step=point.step,
            throughput=point.throughput,
            step_time_seconds=point.step_time_seconds,
            at=point.at or now,
        )
        for point in result.progress
    ]
    if samples:
        ProgressSample.objects.bulk_create(samples)
        ProgressSample.objects.filter(workload=workload, at__lt=now - SAMPLE_RETENTION).delete()
    return len(samples)


def _has_event(workload: Workload, attempt: int, kind: str) -> bool:
    return AuditEvent.objects.filter(workload=workload, attempt=attempt, kind=kind).exists()
