"""Hang detection: no training progress for longer than the job's own pace allows.

A fixed timeout is wrong both ways: a job with 2-second steps is long dead after 10 minutes of
silence, while a job with 20-minute steps is healthy at 25. The allowance is therefore derived
from the job's own recent step intervals, with a floor so that a fast job is not declared hung
over a pause that any job may take (evaluation, a slow filesystem, garbage collection).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from recovery.detection.findings import HANG, Finding
from recovery.detection.taxonomy import NO_CATEGORY, Attribution, Severity

# Enough step changes to smooth out evaluation pauses, few enough to follow a job whose pace
# changed (a restart on fewer nodes, a new phase of the curriculum).
RECENT_STEP_CHANGES = 50


@dataclass(frozen=True)
class HangPolicy:
    """How long a job may go without a new step.

    ``floor_seconds`` is the least silence ever allowed; ``step_time_factor`` times the job's
    median step interval raises it for slow jobs. ``startup_grace_seconds`` covers start-up
    (loading data, compiling, building NCCL communicators) before the first step is seen, and
    ``checkpoint_grace_seconds`` is added while a checkpoint save is in progress.
    """

    floor_seconds: float = 1800
    step_time_factor: float = 10.0
    startup_grace_seconds: float = 900
    checkpoint_grace_seconds: float = 1800


@dataclass(frozen=True)
class ProgressObservation:
    """A step seen at a time, optionally from one rank or node."""

    at: datetime
    step: int
    rank: int | None = None
    node: str | None = None


@dataclass(frozen=True)
class _Member:
    """What one rank/node (or the whole job, when observations carry neither) showed."""

    key: tuple[str | None, int | None]
    last_seen: datetime
    last_change_at: datetime
    last_step: int
    intervals: tuple[float, ...]


def format_duration(seconds: float) -> str:
    """A short human duration: "45 s", "41 min", "2 h 05 min"."""
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 120:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def _require_aware(name: str, value: datetime) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be a timezone-aware datetime, got {value!r}.")


def _members(observations: Sequence[ProgressObservation]) -> list[_Member]:
    by_key: dict[tuple[str | None, int | None], list[ProgressObservation]] = {}
    for observation in sorted(observations, key=lambda item: item.at):
        by_key.setdefault((observation.node, observation.rank), []).append(observation)
    members = []
    for key, series in by_key.items():
        # A member's first observation is progress too: it shows the step was reached. After
        # that only a different step is progress; a repeated step is the same line again.
        change_times = [series[0].at]
        previous_step = series[0].step
        for observation in series[1:]:
            if observation.step != previous_step:
                change_times.append(observation.at)
                previous_step = observation.step
        recent = change_times[-(RECENT_STEP_CHANGES + 1) :]
        intervals = tuple(
            seconds
            for earlier, later in itertools.pairwise(recent)
            if (seconds := (later - earlier).total_seconds()) > 0
        )
        members.append(
            _Member(
                key=key,
                last_seen=series[-1].at,
                last_change_at=change_times[-1],
                last_step=series[-1].step,
                intervals=intervals,
            )
        )
    return members


def median_step_time(observations: Sequence[ProgressObservation]) -> float | None:
    """The median time between consecutive distinct steps of each rank or node, if any."""
    intervals = [seconds for member in _members(observations) for seconds in member.intervals]
    return statistics.median(intervals) if intervals else None


@dataclass(frozen=True)
class _Silence:
    """How long the job has been silent from, and how long it may be."""

    silent_since: datetime
    allowed_seconds: float
    median_step_seconds: float | None
    checkpoint_in_progress: bool
    current: list[_Member]
    last_progress_at: datetime | None
    last_step: int | None


def _allowed_silence(
    observations: Sequence[ProgressObservation],
    started_at: datetime,
    policy: HangPolicy,
    checkpoint_started_at: datetime | None,
    checkpoint_finished_at: datetime | None,
) -> _Silence:
    median_step_seconds = median_step_time(observations)
    allowed_seconds = float(policy.floor_seconds)
    if median_step_seconds is not None:
        allowed_seconds = max(allowed_seconds, policy.step_time_factor * median_step_seconds)

    checkpoint_in_progress = checkpoint_started_at is not None and (
        checkpoint_finished_at is None or checkpoint_started_at > checkpoint_finished_at
    )
    if checkpoint_in_progress:
        allowed_seconds += policy.checkpoint_grace_seconds

    current = _members([item for item in observations if item.at >= started_at])
    last_progress_at: datetime | None = None
    last_step: int | None = None
    if current:
        latest = max(current, key=lambda member: (member.last_change_at, member.last_step))
        last_progress_at = latest.last_change_at
        last_step = latest.last_step
        silent_since = latest.last_change_at
    else:
        # No step yet in this attempt: the silence counts from the end of the start-up grace
        # (the allowance is never negative, so nothing is found before the grace ends).
        silent_since = started_at + timedelta(seconds=policy.startup_grace_seconds)
    if checkpoint_finished_at is not None and checkpoint_finished_at > silent_since:
        # A save that ended after the last step (and the start-up grace) is a sign of life.
        silent_since = checkpoint_finished_at
    return _Silence(
        silent_since,
        allowed_seconds,
        median_step_seconds,
        checkpoint_in_progress,
        current,
        last_progress_at,
        last_step,
    )


def detect_hang(
    observations: Sequence[ProgressObservation],
    *,
    now: datetime,
    started_at: datetime,
    policy: HangPolicy,
    checkpoint_started_at: datetime | None = None,
    checkpoint_finished_at: datetime | None = None,
) -> Finding | None:
    """A hang finding when the job has been silent longer than allowed, else None
    (``check_hang``'s finding)."""
    finding, _ = check_hang(
        observations,
        now=now,
        started_at=started_at,
        policy=policy,
        checkpoint_started_at=checkpoint_started_at,
        checkpoint_finished_at=checkpoint_finished_at,
    )
    return finding


def check_hang(
    observations: Sequence[ProgressObservation],
    *,
    now: datetime,
    started_at: datetime,
    policy: HangPolicy,
    checkpoint_started_at: datetime | None = None,
    checkpoint_finished_at: datetime | None = None,
) -> tuple[Finding | None, datetime]:
    """A hang finding when the job has been silent longer than allowed, else None; and the
    moment after which these observations show a hang unless more progress comes (a worker
    that read nothing new since need not look again before it).

    * Allowed silence is ``max(floor, factor * median interval between consecutive distinct
      steps)``, over each member's last ``RECENT_STEP_CHANGES`` changes. Any change of step
      counts, not only an increase: some frameworks restart their counter every epoch.
    * Observations from before ``started_at`` belong to an earlier attempt: they inform the
      median step time (the same job, the same pace) but are not progress of this attempt.
    * With no step seen in this attempt there is no hang before ``started_at +
      startup_grace``; after it the silence counts from the end of the grace period.
    * A finished checkpoint save is a sign of life: silence counts from the later of the last
      step and the save's end. A save in progress (started after the last finished one)
      extends the allowance by ``checkpoint_grace_seconds``.
    * When observations name ranks or nodes, those whose last observation is older than the
      most recent member's by more than one median interval went silent first; they are the
      finding's ``ranks``/``nodes``, the likeliest place the hang started.
    """
    _require_aware("now", now)
    _require_aware("started_at", started_at)
    for observation in observations:
        _require_aware("observation time", observation.at)
    for name, value in (
        ("checkpoint_started_at", checkpoint_started_at),
        ("checkpoint_finished_at", checkpoint_finished_at),
    ):
        if value is not None:
            _require_aware(name, value)

    silence = _allowed_silence(
        observations, started_at, policy, checkpoint_started_at, checkpoint_finished_at
    )
    due = silence.silent_since + timedelta(seconds=silence.allowed_seconds)
    silent_seconds = (now - silence.silent_since).total_seconds()
    if silent_seconds <= silence.allowed_seconds:
        return None, due
    median_step_seconds = silence.median_step_seconds
    allowed_seconds = silence.allowed_seconds
    checkpoint_in_progress = silence.checkpoint_in_progress
    current = silence.current
    last_progress_at = silence.last_progress_at
    last_step = silence.last_step
    silent_first = _silent_first(current, median_step_seconds)
    if last_progress_at is not None:
        evidence = (
            f"no progress for {format_duration(silent_seconds)} "
            f"(allowed {format_duration(allowed_seconds)}); "
            f"last step {last_step} at {last_progress_at:%H:%M:%S %Z}".rstrip()
        )
    else:
        evidence = (
            f"no progress step seen since the start at {started_at:%H:%M:%S %Z}".rstrip()
            + f"; {format_duration(silent_seconds)} past the "
            f"{format_duration(policy.startup_grace_seconds)} start-up grace "
            f"(allowed {format_duration(allowed_seconds)})"
        )
    if checkpoint_in_progress:
        evidence += "; a checkpoint save was in progress"
    if silent_first:
        names = [_member_name(member) for member in silent_first]
        evidence += f"; went silent first: {', '.join(names)}"

    finding = Finding(
        kind=HANG,
        # A hang has no log category of its own: what caused it is for attribution to find.
        category=NO_CATEGORY,
        attribution=Attribution.UNKNOWN,
        severity=Severity.ERROR,
        signature="no-progress",
        evidence=evidence,
        source="progress",
        nodes=sorted({m.key[0] for m in silent_first if m.key[0] is not None}),
        ranks=sorted({m.key[1] for m in silent_first if m.key[1] is not None}),
        at=now,
        detail={
            "last_step": last_step,
            "last_progress_at": last_progress_at.isoformat() if last_progress_at else None,
            "silent_seconds": silent_seconds,
            "allowed_seconds": allowed_seconds,
            "median_step_seconds": median_step_seconds,
            "checkpoint_in_progress": checkpoint_in_progress,
            "silent_first": [
                {
                    "node": member.key[0],
                    "rank": member.key[1],
                    "last_seen": member.last_seen.isoformat(),
                    "last_step": member.last_step,
                }
                for member in silent_first
            ],
        },
    )
    return finding, due


def _silent_first(members: list[_Member], median_step_seconds: float | None) -> list[_Member]:
    named = [member for member in members if member.key != (None, None)]
    if len(named) < 2 or median_step_seconds is None:
        return []
    newest = max(member.last_seen for member in named)
    cutoff = newest - timedelta(seconds=median_step_seconds)
    return sorted(
        (member for member in named if member.last_seen < cutoff),
        key=lambda member: (member.last_seen, str(member.key)),
    )


def _member_name(member: _Member) -> str:
    node, rank = member.key
    if node is not None and rank is not None:
        return f"rank {rank} on {node}"
    return node if node is not None else f"rank {rank}"
