"""The loop's central step: what one read found becomes anomalies, attributed and decided on.

``record_read`` records one read of a job's output, whichever way it came (the output file,
``recovery.loop.logs``; a log store, ``recovery.loop.log_stores``; lines a job pushed,
``recovery.loop.push``): its progress and checkpoints first, then its findings.
``record_findings`` picks the causes among the findings, and ``record_anomalies`` stores each
once, attributes it (``recovery.loop.attribution``), flags suspect nodes
(``recovery.loop.suspects``) and lets the policy decide (``recovery.loop.policy``). The monitors
and GPU checks record what they find through ``record_anomalies`` too, so every signal family
takes the same path.

Beside it: the read's progress and checkpoints (``recovery.loop.progress``), the attempt each
finding is about (``recovery.loop.evidence_attempts``) and the caps on new anomalies
(``recovery.loop.anomaly_caps``).
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from recovery.audit.actors import Actor
from recovery.audit.record import record_events
from recovery.choices import AuditKind, Confirmation, EvidenceSource, Severity, trust_of
from recovery.detection.findings import Finding, FindingSource
from recovery.detection.scanner.results import ScanResult
from recovery.detection.signatures.base import GENERIC_EXCEPTION, SignatureRole
from recovery.loop.anomaly_caps import _attempt_key, _Caps
from recovery.loop.attribution import attribute_builtin, awaiting_provider, complete_attribution
from recovery.loop.confirmation import (
    NO_CONFIRMATION,
    FirstLook,
    ReadContext,
    first_look,
    last_sample_id,
    settled_event,
)
from recovery.loop.decision_facts import blast_facts_shared
from recovery.loop.drains import propose_drains
from recovery.loop.evidence_attempts import (
    EarlierAttempts,
    attempt_printing_at,
    attempt_with_nodes,
    attempt_writing,
    printed_at,
)
from recovery.loop.policy import decide_when_ready
from recovery.loop.progress import record_progress
from recovery.loop.suspects import flag_suspect_nodes
from recovery.models import Anomaly, Attempt, AuditEvent, Workload
from recovery.schedulers.validation import MAX_NODE_NAME_LENGTH, name_problem, shown

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
        "reported_by_nodes",
        "since_step",
        "nonfinite_steps",
        "baseline_loss",
        "lowest_loss",
        "members_slowed",
        "printed",
        "stall_basis",
        "longest_quiet_seconds",
        # The end of the job's output, kept with a failure nothing explained.
        "last_lines",
    }
)
MAX_EXCERPT = 4000
# The deciding line as stored; the scanner keeps 1000 characters of it already.
MAX_EVIDENCE_LINE = 4000
# How many fingerprints one lookup of stored anomalies sends to the database.
FINGERPRINTS_PER_QUERY = 500
# How long after an attempt ended a node's failure still counts as evidence about it, and how
# long after a controller's restart Slurm's requeue notice is still its echo.
RECENT_END = timedelta(minutes=10)


def record_read(
    workload: Workload, result: ScanResult, now: datetime, *, source: EvidenceSource
) -> tuple[int, int]:
    """Record one read of a job's output: its progress first, then its findings.

    ``source`` says which: an output file, lines the job pushed, a log store. All three are
    the user's to write (``EvidenceTrust.USER``).

    Progress goes first so that a crash line followed by further steps in the same read is
    recorded as survived, and the steps after it in later reads are told from those before.
    Returns the anomalies created and the checkpoints recorded.
    """
    attempt = attempt_writing(workload)
    samples_before = last_sample_id(workload)
    saved = record_progress(workload, attempt, result, now)
    created = record_findings(
        workload, attempt, result, now, source=source, samples_before=samples_before
    )
    return created, saved


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
    source: EvidenceSource,
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
        workload,
        attempt,
        recorded,
        now,
        source=source,
        scope=scope,
        secondary=secondary,
        read=read,
    )
    return len(created)


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
    source: EvidenceSource,
    scope: str = "",
    secondary: list[dict[str, object]] | None = None,
    read: ReadContext | None = None,
) -> list[Anomaly]:
    """Store each finding as an anomaly once, then attribute it and let the policy decide.

    A crash the job printed itself is recorded as suspected unless ``read`` (the rest of the
    same read) already settles it; see ``recovery.loop.confirmation``. A finding seen again (a
    re-read, a repeated poll) only adds to the stored anomaly's count, ranks and nodes, except
    that a crash survived before is suspected again. Returns the anomalies created now.

    The work of one read is bounded whatever a job prints: lines from logs add at most
    ``MAX_NEW_ANOMALIES_PER_READ`` anomalies, and an attempt holds at most
    ``MAX_ANOMALIES_PER_ATTEMPT``; further distinct findings are folded into an existing
    anomaly (``_Caps``), with no rows or events of their own. At most
    ``MAX_PROVIDER_CALLS_PER_READ`` new anomalies await the provider's verdict, asked once the
    read is committed (``finish_attribution``), never under the read's locks.
    """
    created_anomalies: list[Anomaly] = []
    to_decide: list[Anomaly] = []
    caps = _Caps(workload)
    earlier = EarlierAttempts(workload)
    prepared = []
    for finding in findings:
        ignored_nodes = _drop_invalid_node_names(finding)
        attempt_of_finding = attempt_with_nodes(workload, attempt, finding.nodes, earlier)
        if attempt_of_finding is attempt:
            attempt_of_finding = attempt_printing_at(
                workload, attempt, printed_at(finding, read), earlier
            )
        prepared.append((finding, ignored_nodes, attempt_of_finding, _fingerprint(finding, scope)))
    stored = _stored(workload, [fingerprint for *_, fingerprint in prepared])
    for finding, ignored_nodes, attempt_of_finding, fingerprint in prepared:
        # The moment it is recorded, not the poll's start: a long poll must not make detection
        # look faster than it was.
        recorded_at = timezone.now()
        anomaly = stored.get((_attempt_key(attempt_of_finding), fingerprint))
        if (
            anomaly is None
            and finding.source == FindingSource.LOG
            and not caps.room_for_one_more(attempt_of_finding)
            and caps.fold(attempt_of_finding, finding, now)
        ):
            continue
        if anomaly is None:
            look = first_look(finding, scope, attempt_of_finding, read, now)
            anomaly, created = _create(
                workload,
                attempt_of_finding,
                finding,
                fingerprint,
                look,
                now,
                recorded_at,
                source=source,
                secondary=secondary,
                ignored_nodes=ignored_nodes,
            )
            # Another finding of this read may share the fingerprint: it adds to this one.
            stored[(_attempt_key(attempt_of_finding), fingerprint)] = anomaly
            if created:
                caps.counted(attempt_of_finding, anomaly)
                created_anomalies.append(anomaly)
                to_decide.append(anomaly)
                _record_detected(
                    anomaly, finding, ignored_nodes, anomaly.detected_at,
                    settled=look.settled_from_suspicion,
                )  # fmt: skip
                continue
        if _seen_again(anomaly, finding, scope, attempt_of_finding, read, now, recorded_at):
            to_decide.append(anomaly)
    caps.apply_folds()
    awaiting: list[int] = []
    with blast_facts_shared():
        _attribute_and_decide(to_decide, created_anomalies, awaiting, now)
    if awaiting:
        transaction.on_commit(partial(finish_attribution, awaiting, now), robust=True)
    return created_anomalies


def _attribute_and_decide(
    to_decide: list[Anomaly], created_anomalies: list[Anomaly], awaiting: list[int], now: datetime
) -> None:
    provider_calls = settings.MAX_PROVIDER_CALLS_PER_READ
    for anomaly in to_decide:
        # Detect, attribute, decide: a confirmed cause is decided in the same transaction, so
        # it never lacks its recommendation; a suspect waits for its confirmation, a symptom
        # may wait for its cause, an anomaly awaiting the provider's verdict waits for it.
        if anomaly in created_anomalies:
            attribute_builtin(
                anomaly, ask_provider=len(awaiting) < provider_calls, created_now=True
            )
            if anomaly.provider_due_at is not None:
                awaiting.append(anomaly.pk)
                continue
            flag_suspect_nodes(anomaly, now)
            propose_drains(anomaly, now)
        decide_when_ready(anomaly, now)


def finish_attribution(anomaly_ids: list[int], now: datetime | None = None) -> int:
    """Ask the provider for the verdicts these anomalies await, then flag suspects and decide.

    Runs once the read that recorded them is committed, and at each poll for verdicts still
    awaited (a worker killed before it asked); never inside a transaction holding a row lock.
    Returns how many verdicts it recorded.
    """
    recorded = 0
    awaiting = Anomaly.objects.filter(pk__in=anomaly_ids).select_related(
        "workload__cluster", "attempt"
    )
    for anomaly in awaiting.order_by("detected_at", "id"):
        if complete_attribution(anomaly) is None:
            continue  # awaited nothing any more, or another worker is asking
        recorded += 1
        at = now or timezone.now()
        flag_suspect_nodes(anomaly, at)
        propose_drains(anomaly, at)
        decide_when_ready(anomaly, at)
    return recorded


def finish_awaited_attributions(cluster_id: int, now: datetime | None = None) -> int:
    """The poll's catch-up: the cluster's verdicts still awaited, a bounded number per poll."""
    due = awaiting_provider(cluster_id, settings.MAX_PROVIDER_CALLS_PER_READ)
    return finish_attribution(due, now) if due else 0


def _stored(workload: Workload, fingerprints: list[str]) -> dict[tuple[int | None, str], Anomaly]:
    """The workload's anomalies with these fingerprints, by (attempt id, fingerprint)."""
    found: dict[tuple[int | None, str], Anomaly] = {}
    unique = sorted(set(fingerprints))
    for start in range(0, len(unique), FINGERPRINTS_PER_QUERY):
        chunk = unique[start : start + FINGERPRINTS_PER_QUERY]
        matching = Anomaly.objects.filter(workload=workload, fingerprint__in=chunk)
        for anomaly in matching.defer(*Anomaly.FACTS):
            found[(anomaly.attempt_id, anomaly.fingerprint)] = anomaly
    return found


def _create(
    workload: Workload,
    attempt: Attempt | None,
    finding: Finding,
    fingerprint: str,
    look: FirstLook,
    now: datetime,
    recorded_at: datetime,
    *,
    source: EvidenceSource,
    secondary: list[dict[str, object]] | None,
    ignored_nodes: list[dict[str, str]],
) -> tuple[Anomaly, bool]:
    settled = look.confirmation not in (NO_CONFIRMATION, Confirmation.SUSPECTED)
    evidence_at = finding.at or now
    fields: dict[str, Any] = {
        "kind": finding.kind,
        "category": finding.category,
        "attribution": finding.attribution,
        "severity": finding.severity,
        "signature": finding.signature[:128],
        "evidence_line": finding.evidence[:MAX_EVIDENCE_LINE],
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
        "evidence_at": evidence_at,
        "last_seen_at": evidence_at,
        "detected_at": recorded_at,
        "confirmation": look.confirmation,
        "confirmation_at": recorded_at if settled else None,
        "confirmation_reason": look.reason[:255],
        "evidence_source": source,
        "evidence_trust": trust_of(source),
    }
    # ``_stored`` found none; another worker reading another source of the same job may have
    # stored the same finding since: the unique constraint says so, and that one is used.
    identity = {"workload": workload, "attempt": attempt, "fingerprint": fingerprint}
    try:
        with transaction.atomic():
            return Anomaly.objects.create(**identity, **fields), True
    except IntegrityError:
        return Anomaly.objects.get(**identity), False


def _seen_again(
    anomaly: Anomaly,
    finding: Finding,
    scope: str,
    attempt: Attempt | None,
    read: ReadContext | None,
    now: datetime,
    recorded_at: datetime,
) -> bool:
    """Add a finding seen before to its anomaly; True when it must be decided again."""
    anomaly.occurrences += finding.count
    if anomaly.confirmation == Confirmation.SURVIVED:
        # The nodes it was seen on before did not stop the job: only the new sighting is
        # evidence against its nodes, should this one end the attempt.
        anomaly.implicated_nodes = sorted(set(finding.nodes))
        anomaly.implicated_ranks = sorted(set(finding.ranks))
    else:
        anomaly.implicated_nodes = sorted(set(anomaly.implicated_nodes) | set(finding.nodes))
        anomaly.implicated_ranks = sorted(set(anomaly.implicated_ranks) | set(finding.ranks))
    seen = finding.at or now
    if anomaly.last_seen_at is None or seen > anomaly.last_seen_at:
        anomaly.last_seen_at = seen
    anomaly.save(
        update_fields=["occurrences", "implicated_nodes", "implicated_ranks", "last_seen_at"]
    )
    if anomaly.confirmation != Confirmation.SURVIVED:
        return False
    look = first_look(finding, scope, attempt, read, now)
    if look.suspect is None:
        return False
    _suspect_again(anomaly, finding, look, recorded_at)
    return True


def _record_detected(
    anomaly: Anomaly,
    finding: Finding,
    ignored_nodes: list[dict[str, str]],
    detected_at: datetime,
    *,
    again: bool = False,
    settled: bool = False,
) -> None:
    """The DETECTED event, and with ``settled`` the confirmation made in the same read, in one
    statement."""
    events = [_detected_event(anomaly, finding, ignored_nodes, detected_at, again=again)]
    if settled:
        events.append(settled_event(anomaly))
    record_events(events)


def _detected_event(
    anomaly: Anomaly,
    finding: Finding,
    ignored_nodes: list[dict[str, str]],
    detected_at: datetime,
    *,
    again: bool,
) -> AuditEvent:
    workload = anomaly.workload
    return AuditEvent(
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
    # How it was printed this time decides how silence after it is read.
    printed = {"printed": finding.detail["printed"]} if "printed" in finding.detail else {}
    anomaly.details = {
        **{k: v for k, v in anomaly.details.items() if k != "printed"},
        "suspect": look.suspect,
        **printed,
    }
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
    _record_detected(anomaly, finding, [], recorded_at, again=True, settled=settled)


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
