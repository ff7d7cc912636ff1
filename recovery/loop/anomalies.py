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
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Value
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from recovery.audit.actors import Actor
from recovery.audit.record import record_event, record_events
from recovery.choices import AuditKind, Confirmation, EvidenceSource, Severity, trust_of
from recovery.detection.findings import Finding, FindingSource
from recovery.detection.quiet_phases import CHECKPOINT, EVALUATION
from recovery.detection.scanner import ScanResult
from recovery.detection.signatures.base import GENERIC_EXCEPTION, SignatureRole
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
from recovery.loop.policy import decide_when_ready
from recovery.loop.suspects import flag_suspect_nodes
from recovery.models import Anomaly, Attempt, AuditEvent, ProgressSample, Workload
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
# Which cap folded a finding, as the ANOMALIES_FOLDED event names it.
CAP_PER_READ = "per_read"
CAP_PER_ATTEMPT = "per_attempt"
# The ANOMALIES_FOLDED event lists at most this many anomalies and signatures.
MAX_FOLDED_SIGNATURES_SHOWN = 20
# How long after an attempt ended a node's failure still counts as evidence about it, and how
# long after a controller's restart Slurm's requeue notice is still its echo.
RECENT_END = timedelta(minutes=10)
PRINTED_BEFORE_START_TOLERANCE = timedelta(seconds=2)
# Progress samples older than this are dropped: the longest window a detector reads.
SAMPLE_RETENTION = timedelta(hours=2)


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


def attempt_writing(workload: Workload) -> Attempt | None:
    """The attempt whose output is being read now.

    Until a requeued job starts again, what it prints is the previous attempt shutting down
    (Slurm's cancel notices, srun's last words): it belongs to that attempt, not to the next.
    """
    return attempt_writing_of(
        list(
            Attempt.objects.filter(
                workload=workload, number__lte=workload.current_attempt
            ).order_by("-number")[:2]
        )
    )


def attempt_writing_of(newest: list[Attempt]) -> Attempt | None:
    """``attempt_writing`` from the workload's newest attempts, newest first."""
    if not newest:
        return None
    current = newest[0]
    if current.started_at is None and len(newest) > 1:
        return newest[1]
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


# How far back evidence read now may belong: the attempts before the current one that the
# control plane never saw running, up to the last one it saw. More than this many requeues
# between two reads is not a gap in observation but a lost cluster.
EARLIER_ATTEMPTS_CONSIDERED = 8


class EarlierAttempts:
    """The attempts before the current one, newest first, read once per read of output."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self._before: dict[int, list[Attempt]] = {}

    def before(self, attempt: Attempt) -> list[Attempt]:
        if attempt.number not in self._before:
            self._before[attempt.number] = list(
                Attempt.objects.filter(workload=self.workload, number__lt=attempt.number).order_by(
                    "-number"
                )[:EARLIER_ATTEMPTS_CONSIDERED]
            )
        return self._before[attempt.number]


def attempt_with_nodes(
    workload: Workload,
    attempt: Attempt | None,
    nodes: list[str],
    earlier: EarlierAttempts | None = None,
) -> Attempt | None:
    """The attempt evidence naming ``nodes`` is about: an earlier one when only it had them.

    A node failure reported while the job already runs again elsewhere (Slurm requeued it
    itself) belongs to the allocation that lost the node, even when the new allocation kept
    some of the old nodes: evidence naming a node the current attempt does not have, and only
    nodes the previous one had, is the previous attempt's. Between the two there may be
    attempts whose nodes nobody read (Slurm started and requeued them between two polls, see
    ``recovery.loop.poll``): one of them had the nodes when the last attempt whose nodes are
    known does not (a job first seen after Slurm restarted it has only such attempts before
    it). What the current attempt lacks is never its failure.
    """
    if attempt is None or not nodes or not attempt.nodes or set(nodes) <= set(attempt.nodes):
        return attempt
    earlier = earlier or EarlierAttempts(workload)
    named = set(nodes)
    first_unseen = None
    for previous in earlier.before(attempt):
        if not previous.nodes:
            first_unseen = first_unseen or previous
            continue
        if named <= set(previous.nodes) or (
            not named & set(attempt.nodes) and named & set(previous.nodes)
        ):
            return previous
        break
    return first_unseen or attempt


def printed_at(finding: Finding, read: ReadContext | None) -> datetime | None:
    """When the finding's line was printed: its own time, else that of the last timed progress
    line before it in the same read (lines such as srun's carry no time of their own)."""
    if finding.at is not None or read is None or finding.first_line is None:
        return finding.at
    before = [
        point.at
        for point in read.progress
        if point.at is not None and point.line < finding.first_line
    ]
    return max(before, default=None)


def attempt_printing_at(
    workload: Workload,
    attempt: Attempt | None,
    at: datetime | None,
    earlier: EarlierAttempts | None = None,
) -> Attempt | None:
    """The earlier attempt when the evidence was printed before the current one started.

    A poll that comes late (workers down, a slow database) reads the end of the previous
    attempt and the start of the next in one read, after Slurm requeued the job itself; what
    the previous attempt printed is not the new one's failure, and acting on it would restart a
    healthy attempt. A time within ``PRINTED_BEFORE_START_TOLERANCE`` of the start is the new
    attempt's (node clocks differ by that much), and so is one before the previous attempt
    began, or before the job was submitted (a clock far off, or a log not in UTC, proves
    nothing). An attempt whose start nobody read (Slurm started and requeued it between two
    polls) started after the one before it: evidence printed since that one began, and before
    the current one, is the newest such attempt's.
    """
    if attempt is None or attempt.started_at is None or at is None:
        return attempt
    if at >= attempt.started_at - PRINTED_BEFORE_START_TOLERANCE:
        return attempt
    earlier = earlier or EarlierAttempts(workload)
    first_unseen = None
    for previous in earlier.before(attempt):
        if previous.started_at is None:
            first_unseen = first_unseen or previous
            continue
        if at >= previous.started_at - PRINTED_BEFORE_START_TOLERANCE:
            return first_unseen or previous
        return attempt
    if first_unseen is not None and at >= workload.submit_time - PRINTED_BEFORE_START_TOLERANCE:
        return first_unseen
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


def _attempt_key(attempt: Attempt | None) -> int | None:
    return attempt.pk if attempt is not None else None


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


def record_progress(
    workload: Workload, attempt: Attempt | None, result: ScanResult, now: datetime
) -> int:
    number = attempt.number if attempt else None
    if number:
        record_progress_samples(workload, number, result, now)
    resumed = bool(
        result.progress
        and number
        and number > 1
        and not _has_event(workload, number, AuditKind.PROGRESS_RESUMED)
    )
    note_quiet_phases(workload, result, now, continues_attempt=not resumed)
    if result.progress:
        latest = result.progress[-1]
        if resumed:
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
    saved = len(record_events(checkpoint_events(workload, number, result, now)))
    if saved and attempt is not None and not attempt.produced_checkpoint:
        attempt.produced_checkpoint = True
        attempt.save(update_fields=["produced_checkpoint"])
    workload.save(update_fields=PROGRESS_FIELDS)
    return saved


# What a read of a job's output changes on its workload.
PROGRESS_FIELDS = [
    "last_progress_step",
    "last_progress_at",
    "last_checkpoint_step",
    "last_checkpoint_at",
    "longest_quiet_seconds",
    "quiet_phase",
    "quiet_phase_at",
    "updated_at",
]


def note_quiet_phases(
    workload: Workload, result: ScanResult, now: datetime, *, continues_attempt: bool
) -> None:
    """Keep what the read shows of the job's quiet phases on ``workload`` (not saved).

    The longest time between two changes of step, within one attempt (the gap across a
    restart is downtime, not a phase of the job), and a checkpoint save or evaluation pass
    announced after the read's last step, which the next step ends.
    """
    times = [
        (point.at or now, point.step)
        for point in sorted(result.progress, key=lambda p: (p.at or now, p.line))
    ]
    previous = None
    if continues_attempt and workload.last_progress_at is not None:
        previous = (workload.last_progress_at, workload.last_progress_step)
    longest = workload.longest_quiet_seconds or 0.0
    for at, step in times:
        if previous is not None and step != previous[1]:
            longest = max(longest, (at - previous[0]).total_seconds())
        if previous is None or step != previous[1]:
            previous = (at, step)
    if longest > 0:
        workload.longest_quiet_seconds = longest
    last_step_line = max((point.line for point in result.progress), default=0)
    announced = [
        (checkpoint.line, CHECKPOINT, checkpoint.at)
        for checkpoint in result.checkpoints
        if not checkpoint.completed
    ] + [(evaluation.line, EVALUATION, evaluation.at) for evaluation in result.evaluations]
    saved_line = max((c.line for c in result.checkpoints if c.completed), default=0)
    phase = max(announced, default=None, key=lambda item: item[0])
    if (
        phase is not None
        and phase[0] > last_step_line
        and not (phase[1] == CHECKPOINT and saved_line > phase[0])
    ):
        workload.quiet_phase, workload.quiet_phase_at = phase[1], phase[2] or now
    elif result.progress or saved_line:
        workload.quiet_phase, workload.quiet_phase_at = "", None


def checkpoint_events(
    workload: Workload, attempt: int | None, result: ScanResult, now: datetime
) -> list[AuditEvent]:
    """The read's finished checkpoints newer than the workload's last, as unsaved
    ``checkpoint_saved`` events; the workload's last checkpoint moves to the newest."""
    events = []
    for checkpoint in result.checkpoints:
        if not checkpoint.completed:
            continue
        step = checkpoint.step
        last = workload.last_checkpoint_step
        if step is not None and last is not None and step <= last:
            continue  # already recorded (or an older one seen again)
        workload.last_checkpoint_step = step
        workload.last_checkpoint_at = checkpoint.at or now
        events.append(
            AuditEvent(
                cluster=workload.cluster,
                workload=workload,
                attempt=attempt,
                kind=AuditKind.CHECKPOINT_SAVED,
                actor=Actor.DETECTOR,
                payload={"step": step, "path": checkpoint.path},
                occurred_at=checkpoint.at or now,
            )
        )
    return events


def finite_or_none(value: float | None) -> float | None:
    """A number the database can store: MySQL has no NaN or infinity."""
    return value if value is not None and math.isfinite(value) else None


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
            loss=finite_or_none(point.loss),
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
