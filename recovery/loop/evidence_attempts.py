"""Which attempt the evidence of a read is about.

A read of a job's output may hold the end of an earlier attempt: Slurm requeued the job between
two polls, a poll came late, a node failure was reported once the job ran elsewhere. Each
finding is placed on the attempt that printed it or lost its nodes, by what was printed and
when, so that the current attempt is never blamed for an earlier one's failure. Apart from
``recovery.loop.anomalies`` because the batched read of a shard
(``recovery.loop.workload_outputs``) and pushed lines (``recovery.loop.push``) place their
reads with the same rules.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from recovery.detection.findings import Finding
from recovery.loop.confirmation import ReadContext
from recovery.models import Attempt, Workload

PRINTED_BEFORE_START_TOLERANCE = timedelta(seconds=2)


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
