"""A crash read from a job's output is a suspicion until the process is seen to end.

Training programs print tracebacks they survive: data loaders and loggers that catch and log,
"Exception ignored in ..." at teardown, retried I/O, callbacks that fail and are skipped. So a
crash line from what a job printed (its output files, pushed log batches, a log store) is
recorded as *suspected*, and nothing acts on it until one of these settles it:

* **confirmed**: the process is seen to end. The attempt ended, a launcher reported a task's
  exit (srun's task-exit lines, torchrun's child failure, slurmstepd's cancel notice), or
  another crash of the same attempt was confirmed. The policy then decides as on any crash.
* **survived**: training went on after it; or the program handled it (``printed`` handled)
  and something else ended the attempt: an administrator's requeue, a preemption or a cancel
  (Slurm's own record of the end says so), or another error that was confirmed. The crash
  stays in the trail and on the timeline, and no recommendation is made.
* **stalled**: the process neither ended nor trained for longer than its quiet phases allow
  (``stall_window``). A process that printed an error and stopped without exiting is hung, not
  crashed: a hang is recorded and decided as any hang.

A quiet phase is not a stall. Jobs go quiet on purpose right after errors they handled (a
skipped sample, then an eval pass or a checkpoint of many minutes), so silence after a suspect
is judged by what the job has shown, and by how the error was printed
(``recovery.detection.tracebacks``):

* a traceback a handler caught and printed (its outermost frame an ordinary function, or a
  logging record's header before it) says the program went on: silence after it is for the
  hang rules alone, as any silence;
* a checkpoint save or evaluation pass announced after the job's last step
  (``Workload.quiet_phase``) is a phase, not a stall: the hang rules, with their checkpoint
  grace, judge it;
* otherwise (the top level ended, a thread or child process died, or it cannot be told) the
  window is ``max(crash_confirmation_seconds, crash_confirmation_step_factor x median step,
  QUIET_PHASE_MARGIN x the longest quiet phase the job has shown)``, and never longer than
  the hang rules would wait (then they decide alone).

Evidence the user does not control (the scheduler's job and node states, a node's kernel log,
GPU metrics) needs no confirmation, nor do the exit reports themselves. A job that reports no
progress cannot be seen to survive or stall: its suspects wait for the process to end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Max
from django.utils import timezone

from recovery.audit.actors import Actor
from recovery.audit.record import record_events
from recovery.choices import (
    AnomalyKind,
    AttemptExitState,
    Attribution,
    AuditKind,
    Confirmation,
    Severity,
    WorkloadState,
)
from recovery.detection.findings import CRASH, HANG, Finding, FindingSource
from recovery.detection.hang import (
    HangPolicy,
    ProgressObservation,
    format_duration,
    median_step_time,
)
from recovery.detection.scanner.results import ProgressPoint
from recovery.detection.signatures.base import SignatureRole
from recovery.detection.signatures.jobs import CANCEL_NOTICE, cancelled_by_someone
from recovery.detection.taxonomy import NO_CATEGORY
from recovery.detection.tracebacks import Printed
from recovery.models import Anomaly, Attempt, AuditEvent, Policy, ProgressSample, Workload

# Findings that only show a consequence: a rank that lost its peer, a wrapper saying a child
# failed. The cause (a node going down, an Xid, the peer's own traceback) may still arrive.
AWAITING_CAUSE_ROLES = frozenset({SignatureRole.SYMPTOM, SignatureRole.WRAPPER})

# The confirmation of an anomaly that needs none (a hang, a straggler): stored blank.
NO_CONFIRMATION = ""

# Reads of something other than the job's own output: a node's kernel log is the node's word.
TRUSTED_LOG_SCOPES = ("kernel:",)
# Distinct new steps after a suspect line that show training went on. One is not enough: in a
# data-parallel job the step in flight when a rank raised completes once on the others (and is
# printed after the traceback); the next cannot complete without the rank that died.
SURVIVAL_STEPS = 2
# How much longer than the longest quiet phase the job has shown silence after an error may last.
QUIET_PHASE_MARGIN = 1.5
# How far back progress samples inform the median step time.
STEP_TIME_LOOK_BACK = timedelta(minutes=30)
MAX_STEP_SAMPLES = 2000
# Why evidence from these signal families needs no confirmation, as the anomaly records it.
TRUSTED_SOURCE_REASONS: dict[str, str] = {
    FindingSource.SCHEDULER: "the scheduler's word",
    FindingSource.METRICS: "GPU metrics",
}
SETTLED_EVENTS = {
    Confirmation.CONFIRMED: AuditKind.CONFIRMED,
    Confirmation.SURVIVED: AuditKind.SURVIVED,
    Confirmation.STALLED: AuditKind.STALLED,
}


@dataclass(frozen=True)
class ReadContext:
    """What one read of a job's output showed besides a finding.

    ``samples_before`` and ``samples_after`` are the workload's last progress sample id before
    and after the read's own samples were stored: later reads' progress is what comes after.
    """

    progress: list[ProgressPoint] = field(default_factory=list)
    exits: list[Finding] = field(default_factory=list)
    samples_before: int = 0
    samples_after: int = 0
    # The last stored step of each attempt up to ``samples_before``: the same for every finding
    # of the read, so asked once.
    steps_stored: dict[int, int | None] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class FirstLook:
    """An anomaly's confirmation state when it is recorded, and what settled it."""

    confirmation: str
    reason: str = ""
    suspect: dict[str, Any] | None = None

    @property
    def settled_from_suspicion(self) -> bool:
        return self.suspect is not None and self.confirmation != Confirmation.SUSPECTED


@dataclass(frozen=True)
class Settlement:
    confirmation: str
    reason: str
    stall: Finding | None = None


def needs_confirmation(finding: Finding, scope: str) -> bool:
    """A crash line the job printed itself, other than a launcher's report that it ended."""
    return (
        finding.kind == CRASH
        and finding.source == FindingSource.LOG
        and not scope.startswith(TRUSTED_LOG_SCOPES)
        and not finding.detail.get("reports_exit")
    )


def last_sample_id(workload: Workload) -> int:
    found = ProgressSample.objects.filter(workload=workload).aggregate(last=Max("id"))["last"]
    return int(found or 0)


def first_look(
    finding: Finding,
    scope: str,
    attempt: Attempt | None,
    read: ReadContext | None,
    now: datetime,
) -> FirstLook:
    """The state to record ``finding`` in, settled at once when the same read settles it."""
    if finding.kind != CRASH:
        return FirstLook(NO_CONFIRMATION)
    if not needs_confirmation(finding, scope):
        return FirstLook(Confirmation.CONFIRMED, _trusted_reason(finding, scope))
    read = read or ReadContext()
    line = int(finding.detail.get("last_line") or finding.first_line or 0)
    step_before = _step_before(attempt, read, line)
    suspect = {
        "since": timezone.now().isoformat(),
        "line": line,
        "step_before": step_before,
        "sample_mark": read.samples_after,
    }
    # Training that went on after the line outweighs an ending seen in the same read: the
    # line did not end the process, something later did.
    went_on = survival_step(step_before, [p.step for p in read.progress if p.line > line])
    if went_on is not None:
        return FirstLook(Confirmation.SURVIVED, _survival_reason(went_on), suspect)
    if attempt is not None and _completed(attempt):
        return FirstLook(Confirmation.SURVIVED, "the job completed", suspect)
    # A cancel notice says someone ended the job, not which error (if any) made them: who it was
    # shows in the scheduler's record of the end, which ``settle`` waits for.
    cancels = [f for f in read.exits if cancelled_by_someone(f.signature, f.evidence)]
    ends = [f for f in read.exits if f not in cancels]
    if cancels:
        suspect["cancel_notice"] = cancels[0].evidence[:300]
    if ends:
        # The first exit is the task that died; the later ones are its peers being stopped.
        first_exit = min(ends, key=lambda f: f.first_line or 0)
        return FirstLook(Confirmation.CONFIRMED, _exit_reason(first_exit), suspect)
    if attempt is not None and (ended := attempt_ending(attempt)):
        if elsewhere := _ended_by_something_else(attempt, finding.detail.get("printed")):
            return FirstLook(Confirmation.SURVIVED, elsewhere, suspect)
        return FirstLook(Confirmation.CONFIRMED, ended, suspect)
    return FirstLook(Confirmation.SUSPECTED, "", suspect)


def survival_step(step_before: int | None, steps_after: list[int]) -> int | None:
    """The step that shows training went on after a suspect line, if the steps after show it."""
    if step_before is None:
        new = set(steps_after)
    else:
        new = {step for step in steps_after if not step_before - 1 <= step <= step_before}
    return max(new) if len(new) >= SURVIVAL_STEPS else None


def attempt_ending(attempt: Attempt) -> str:
    """Why ``attempt`` is over, or "" while it runs."""
    workload = attempt.workload
    if attempt.exit_state != AttemptExitState.RUNNING:
        return f"the attempt ended ({attempt.get_exit_state_display().lower()})"
    if attempt.ended_at is not None or workload.current_attempt > attempt.number:
        return "the attempt ended"
    if workload.state not in (WorkloadState.RUNNING, WorkloadState.UNKNOWN):
        return f"the job left running ({workload.get_state_display().lower()})"
    return ""


# How Slurm ended attempts it was asked to end, or chose to.
ENDED_BY_OTHERS = frozenset(
    {AttemptExitState.REQUEUED, AttemptExitState.PREEMPTED, AttemptExitState.CANCELLED}
)


def _ended_by_something_else(
    attempt: Attempt, printed: object, anomaly: Anomaly | None = None
) -> str:
    """Why the end of ``attempt`` is not that of an error it printed, or "" when it may be.

    Only an error the program caught and went on from (``printed`` handled) can be told apart
    from the end: an administrator's requeue, a preemption or a cancel, or another error that
    was confirmed, ended the attempt. A restart on the handled one would act on a job already
    dealt with, and exclude the nodes of an error that changed nothing. A traceback that ended
    the top level, a thread or a child is taken for the end's cause, as before.
    """
    if printed != Printed.HANDLED:
        return ""
    if attempt.exit_state in ENDED_BY_OTHERS:
        return (
            f"the scheduler ended the attempt ({attempt.get_exit_state_display().lower()}), "
            "not this error the program handled"
        )
    if anomaly is None:
        return ""
    other = _other_confirmed(anomaly, causes_only=True)
    if other is None:
        return ""
    return (
        f"the program handled it; the attempt failed on another error: {other.evidence_line[:200]}"
    )


def _other_confirmed(anomaly: Anomaly, *, causes_only: bool = False) -> Anomaly | None:
    """The first other confirmed anomaly of the attempt; with ``causes_only``, not a mere
    report that a process ended (srun's task exit, a cancel notice): that ends the handled
    error's process as much as any other's."""
    confirmed = (
        Anomaly.objects.filter(
            workload=anomaly.workload, attempt=anomaly.attempt, confirmation=Confirmation.CONFIRMED
        )
        .exclude(pk=anomaly.pk)
        .defer(*Anomaly.FACTS)
        .order_by("detected_at", "id")
    )
    for other in confirmed[:50]:
        if cancelled_by_someone(other.signature, other.evidence_line):
            continue  # someone ended the job: not a failure of its own
        if not causes_only or not other.details.get("reports_exit"):
            return other
    return None


def _cancel_notice_seen(anomaly: Anomaly) -> bool:
    """Whether slurmstepd's notice of a job someone cancelled was read for this attempt."""
    notices = Anomaly.objects.filter(
        workload=anomaly.workload, attempt=anomaly.attempt, signature=CANCEL_NOTICE
    ).values_list("evidence_line", flat=True)
    return any(cancelled_by_someone(CANCEL_NOTICE, line) for line in notices[:50])


def _completed(attempt: Attempt) -> bool:
    """The attempt ended successfully: whatever it printed did not end it."""
    workload = attempt.workload
    return attempt.exit_state == AttemptExitState.COMPLETED or (
        workload.current_attempt == attempt.number and workload.state == WorkloadState.COMPLETED
    )


def settle(anomaly: Anomaly, policy: Policy, now: datetime) -> Settlement | None:
    """What settles a suspected crash now, if anything does yet."""
    attempt = anomaly.attempt
    if attempt is None:
        return Settlement(Confirmation.CONFIRMED, "no attempt to wait for")
    suspect = anomaly.details.get("suspect") or {}
    step_before = suspect.get("step_before")
    later = ProgressSample.objects.filter(
        workload=anomaly.workload, attempt=attempt.number, id__gt=int(suspect.get("sample_mark", 0))
    ).order_by("id")
    went_on = survival_step(step_before, list(later.values_list("step", flat=True)[:1000]))
    if went_on is not None:
        return Settlement(Confirmation.SURVIVED, _survival_reason(went_on))
    if _completed(attempt):
        return Settlement(Confirmation.SURVIVED, "the job completed")
    ended = attempt_ending(attempt)
    if not ended and (suspect.get("cancel_notice") or _cancel_notice_seen(anomaly)):
        # The job was cancelled, and the poll has not read how it ended yet: settling now would
        # confirm an error its owner's (or an administrator's) cancel may have ended instead.
        return None
    failed = None if ended else _other_confirmed(anomaly)
    if ended or failed is not None:
        if elsewhere := _ended_by_something_else(attempt, anomaly.details.get("printed"), anomaly):
            return Settlement(Confirmation.SURVIVED, elsewhere)
        if failed is not None:
            ended = f"the attempt failed: {failed.evidence_line[:200]}"
        return Settlement(Confirmation.CONFIRMED, ended)
    return _stall(anomaly, policy, suspect, now)


def _stall(
    anomaly: Anomaly, policy: Policy, suspect: dict[str, Any], now: datetime
) -> Settlement | None:
    """Settled as stalled once the job made no progress for the confirmation window."""
    assert anomaly.attempt is not None
    reports_progress = (
        suspect.get("step_before") is not None
        or ProgressSample.objects.filter(
            workload=anomaly.workload, attempt=anomaly.attempt.number
        ).exists()
    )
    if not reports_progress:
        return None  # silence says nothing about a job that never reports progress
    if anomaly.details.get("printed") == Printed.HANDLED:
        return None  # the program caught it and went on: its silence is the hang rules'
    workload = anomaly.workload
    if workload.quiet_phase:
        return None  # a checkpoint or evaluation it announced: the hang rules judge it
    median = _median_step_seconds(workload, now)
    window, basis = stall_window(policy, median, workload.longest_quiet_seconds)
    if window is None:
        return None
    since = datetime.fromisoformat(suspect.get("since") or anomaly.detected_at.isoformat())
    # A checkpoint announced after the error and saved since was a phase: the silence that
    # counts starts when it ended, as the job needs a step's time to print again.
    if workload.last_checkpoint_at is not None and workload.last_checkpoint_at > since:
        since = min(workload.last_checkpoint_at, now)
    silent = (now - since).total_seconds()
    if silent < window:
        return None
    reason = f"no exit and no progress for {format_duration(silent)} after it"
    hang = Finding(
        kind=HANG,
        # A hang has no log category of its own: the error it followed is in its evidence.
        category=NO_CATEGORY,
        attribution=Attribution.UNKNOWN,
        severity=Severity.ERROR,
        signature="no-progress-after-error",
        evidence=f"no progress for {format_duration(silent)} after: {anomaly.evidence_line[:300]}",
        source=FindingSource.PROGRESS,
        nodes=list(anomaly.implicated_nodes),
        ranks=list(anomaly.implicated_ranks),
        at=since + timedelta(seconds=window),
        detail={
            # Silence after a lost peer is that loss's consequence too: it waits for the
            # cause (the node Slurm marks down some seconds later) as the error would have.
            "role": _stall_role(anomaly),
            "silent_seconds": silent,
            "allowed_seconds": window,
            "stall_basis": basis,
            "median_step_seconds": median,
            "longest_quiet_seconds": workload.longest_quiet_seconds,
            "printed": anomaly.details.get("printed", ""),
            "stalled_after": anomaly.pk,
        },
    )
    return Settlement(Confirmation.STALLED, reason, hang)


def hang_policy(policy: Policy) -> HangPolicy:
    floor = policy.hang_timeout_minutes * 60.0
    return HangPolicy(
        floor_seconds=floor,
        step_time_factor=policy.hang_step_time_factor,
        # Start-up (data loading, communicator set-up) and checkpoint saves may take longer
        # than a step; a job stuck there is still caught, later.
        startup_grace_seconds=max(2 * floor, 600.0),
        checkpoint_grace_seconds=floor,
    )


def stall_window(
    policy: Policy, median_step: float | None, longest_quiet: float | None
) -> tuple[float | None, str]:
    """How long silence after an error may last before it is a stall, and what decided it.

    None when the hang rules would call the silence a hang no later: they decide alone.
    """
    candidates = [(float(policy.crash_confirmation_seconds), "confirmation seconds")]
    if median_step is not None:
        candidates.append((policy.crash_confirmation_step_factor * median_step, "median step time"))
    if longest_quiet:
        candidates.append((QUIET_PHASE_MARGIN * longest_quiet, "longest quiet phase"))
    window, basis = max(candidates)
    hang = hang_policy(policy)
    allowance = max(hang.floor_seconds, hang.step_time_factor * (median_step or 0.0))
    if window >= allowance:
        return None, "hang rules"
    return window, basis


def _stall_role(anomaly: Anomaly) -> str:
    role = anomaly.details.get("role")
    return SignatureRole.SYMPTOM if role in AWAITING_CAUSE_ROLES else SignatureRole.CAUSE


def apply(anomaly: Anomaly, settlement: Settlement, now: datetime) -> bool:
    """Store the settlement of a suspect once, with its audit event; False if already settled."""
    changed = Anomaly.objects.filter(pk=anomaly.pk, confirmation=Confirmation.SUSPECTED).update(
        confirmation=settlement.confirmation,
        confirmation_at=now,
        confirmation_reason=settlement.reason[:255],
    )
    if not changed:
        return False
    anomaly.confirmation = settlement.confirmation
    anomaly.confirmation_at = now
    anomaly.confirmation_reason = settlement.reason[:255]
    record_settled(anomaly)
    return True


def record_settled(anomaly: Anomaly) -> None:
    """The audit event of a suspect that was confirmed, survived or stalled."""
    record_events([settled_event(anomaly)])


def settled_event(anomaly: Anomaly) -> AuditEvent:
    """``record_settled``'s event, unsaved."""
    assert anomaly.confirmation_at is not None
    suspect = anomaly.details.get("suspect") or {}
    since = suspect.get("since")
    workload = anomaly.workload
    return AuditEvent(
        cluster=workload.cluster,
        workload=workload,
        attempt=anomaly.attempt.number if anomaly.attempt else None,
        kind=SETTLED_EVENTS[Confirmation(anomaly.confirmation)],
        actor=Actor.DETECTOR,
        payload={
            "anomaly": anomaly.pk,
            "reason": anomaly.confirmation_reason,
            "evidence": anomaly.evidence_line[:300],
            "evidence_to_settled_s": round(
                (anomaly.confirmation_at - anomaly.evidence_at).total_seconds(), 3
            ),
            "suspected_for_s": round(
                (anomaly.confirmation_at - datetime.fromisoformat(since)).total_seconds(), 3
            )
            if since
            else None,
        },
        occurred_at=anomaly.confirmation_at,
    )


def suspects_of(cluster_id: int, since: datetime) -> list[Anomaly]:
    return list(
        Anomaly.objects.filter(
            workload__cluster_id=cluster_id,
            kind=AnomalyKind.CRASH,
            confirmation=Confirmation.SUSPECTED,
            detected_at__gte=since,
        )
        .select_related("workload__cluster", "attempt__workload")
        .order_by("detected_at", "id")
    )


def _step_before(attempt: Attempt | None, read: ReadContext, line: int) -> int | None:
    """The last step the attempt reached before the suspect line."""
    steps = [point.step for point in read.progress if point.line < line]
    if attempt is not None:
        stored = _last_stored_step(attempt, read)
        if stored is not None:
            steps.append(stored)
    return max(steps) if steps else None


def _last_stored_step(attempt: Attempt, read: ReadContext) -> int | None:
    if read.samples_before <= 0:
        return None  # sample ids start at 1: nothing was stored before the read
    if attempt.number not in read.steps_stored:
        stored = ProgressSample.objects.filter(
            workload_id=attempt.workload_id, attempt=attempt.number, id__lte=read.samples_before
        ).aggregate(last=Max("step"))["last"]
        read.steps_stored[attempt.number] = None if stored is None else int(stored)
    return read.steps_stored[attempt.number]


def _median_step_seconds(workload: Workload, now: datetime) -> float | None:
    samples = ProgressSample.objects.filter(
        workload=workload, at__gte=now - STEP_TIME_LOOK_BACK
    ).order_by("-at", "-id")[:MAX_STEP_SAMPLES]
    return median_step_time(
        [
            ProgressObservation(at=s.at, step=s.step, rank=s.rank, node=s.node or None)
            for s in samples
        ]
    )


def _trusted_reason(finding: Finding, scope: str) -> str:
    if finding.detail.get("reports_exit"):
        return "a launcher reported the exit"
    if scope.startswith(TRUSTED_LOG_SCOPES):
        return "the node's kernel log"
    return TRUSTED_SOURCE_REASONS.get(finding.source, finding.source)


def _exit_reason(exit_finding: Finding) -> str:
    return f"exit reported: {exit_finding.evidence[:200]}"


def _survival_reason(step: int) -> str:
    return f"training went on: step {step} after it"
