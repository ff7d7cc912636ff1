"""The per-workload half of a poll: new output read, endings judged, progress checked.

A cluster's poll (``recovery.loop.poll``) takes the scheduler's snapshot and syncs it; what each
listed workload then needs is done here, for a batch of workloads at a time, so that a large
cluster's workloads can be shared among workers (``tasks.polling.process_workloads``, one batch
per shard of workload ids, never two workers on one shard).

Each workload's new output is read and recorded first, most of it in bulk
(``recovery.loop.workload_outputs``).

Then the monitors that judge one workload: how an ended attempt ended (``Attempt.
ending_to_judge``, set by the poll when the scheduler reported the ending: judged after the
output that explains it was read) and, every ``PROGRESS_CHECK_SECONDS`` or sooner, hangs and
stragglers.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from functools import partial

from django.db import transaction
from django.utils import timezone

from recovery.audit.live import announcements_batched
from recovery.choices import WorkloadState
from recovery.loop import held
from recovery.loop.log_stores import ingest_from_source
from recovery.loop.logs import output_tail
from recovery.loop.monitors import SchedulerEnding, check_job_ending, run_progress_check
from recovery.loop.policy import policies_read_once, policy_for
from recovery.loop.workload_outputs import WorkloadsSummary, _Batch, _load_batch, _read_outputs
from recovery.models import Attempt, Cluster, Workload
from recovery.schedulers.base import Transport
from recovery.sources.logs import LogSource, LogSourceError

logger = logging.getLogger(__name__)

# Hangs are judged against a silence of minutes (the policy's hang timeout is one minute at
# least, thirty by default) and stragglers over a window of minutes (ten by default): a check
# every half minute loses little of it, and each check reads up to two thousand samples.
PROGRESS_CHECK_SECONDS = 30.0
# How close to its hang timeout a silent workload's silence must be to be checked every poll.
HANG_NEAR = timedelta(seconds=15)


def process_workloads(
    cluster: Cluster,
    workload_ids: list[int],
    transport: Transport | None,
    now: datetime | None = None,
    *,
    log_store: LogSource | None = None,
    read_logs: bool = True,
    tokens: Mapping[int, str] | None = None,
) -> WorkloadsSummary:
    """Read, judge and check the given workloads of ``cluster`` (others are ignored).

    With ``tokens`` (the snapshot's ``recovery.loop.held`` token of each workload), a workload
    this process processed before and finds quiet is left alone, and what each processed one
    looks like afterwards is remembered.
    """
    now = now or timezone.now()
    summary = WorkloadsSummary()
    # Output in a log store grows unseen by a stat: such a cluster's workloads are all read.
    holding = tokens is not None and read_logs and transport is not None and log_store is None
    if holding:
        assert tokens is not None and transport is not None
        sizes = transport.output_sizes(held.remembered_paths(cluster.pk, workload_ids))
        mine = {pk: tokens[pk] for pk in workload_ids if pk in tokens}
        left = held.quiet(cluster.pk, mine, sizes, now)
        summary.left_quiet = len(left)
        workload_ids = [pk for pk in workload_ids if pk not in left]
    if workload_ids:
        with announcements_batched(), policies_read_once():
            batch = _process(cluster, workload_ids, transport, now, log_store, read_logs, summary)
            if holding and batch is not None:
                assert tokens is not None
                _remember(cluster, batch, tokens, now)
    return summary


def _process(
    cluster: Cluster,
    workload_ids: list[int],
    transport: Transport | None,
    now: datetime,
    log_store: LogSource | None,
    read_logs: bool,
    summary: WorkloadsSummary,
) -> _Batch | None:
    workloads = list(Workload.objects.filter(cluster=cluster, pk__in=workload_ids))
    for workload in workloads:
        workload.cluster = cluster
    summary.workloads = len(workloads)
    if not workloads:
        return None
    batch = _load_batch(workloads) if read_logs and transport is not None else _Batch(workloads)
    if read_logs and transport is not None:
        _read_outputs(batch, transport, now, summary)
    if read_logs and log_store is not None:
        _read_log_store(workloads, log_store, now, summary)
    summary.anomalies_new += _judge_endings(workloads, now, transport if read_logs else None)
    batch.rechecks = _check_progress(workloads, now, summary)
    return batch


def _remember(cluster: Cluster, batch: _Batch, tokens: Mapping[int, str], now: datetime) -> None:
    """What each workload of the batch looks like now that it was processed, for the next
    poll of this process to tell whether it is quiet (``recovery.loop.held``)."""
    rechecks = batch.rechecks
    for workload in batch.workloads:
        paths = list(dict.fromkeys(p for p in (workload.stdout_path, workload.stderr_path) if p))
        token = tokens.get(workload.pk)
        if (
            token is None
            or workload.pk in batch.unsettled
            or any((workload.pk, path) not in batch.sizes for path in paths)
        ):
            held.forget(cluster.pk, workload.pk)
            continue
        if workload.pk in rechecks:
            recheck_at = rechecks[workload.pk] or now + held.HELD_FOR
        else:
            recheck_at = _next_check_at(workload, now)
        held.remember(
            cluster.pk,
            workload.pk,
            held.Held(
                token=token,
                sizes={path: batch.sizes[(workload.pk, path)] for path in paths},
                recheck_at=recheck_at,
                held_at=now,
            ),
        )


def _read_log_store(
    workloads: list[Workload], log_store: LogSource, now: datetime, summary: WorkloadsSummary
) -> None:
    for workload in workloads:
        try:
            pulled = ingest_from_source(workload, log_store, now)
        except LogSourceError as error:
            # The store is down for every job alike: say it once, read it next poll.
            summary.log_store_error = str(error)
            logger.warning("log store of %s: %s", workload.cluster.name, error)
            return
        summary.log_bytes += pulled.bytes_read
        summary.anomalies_new += pulled.anomalies_new


def _judge_endings(workloads: list[Workload], now: datetime, transport: Transport | None) -> int:
    """How the attempts the scheduler ended did end, once their output was read; the end of
    the output is read again only for a failure nothing explained."""
    by_id = {w.pk: w for w in workloads}
    waiting = Attempt.objects.filter(
        workload_id__in=list(by_id), ending_to_judge__isnull=False
    ).values_list("pk", flat=True)
    new = 0
    for attempt_id in list(waiting):
        with transaction.atomic():
            attempt = (
                Attempt.objects.select_for_update()
                .filter(pk=attempt_id, ending_to_judge__isnull=False)
                .first()
            )
            if attempt is None:
                continue  # judged by another worker a moment ago
            ending = SchedulerEnding.from_json(attempt.ending_to_judge or {})
            workload = by_id[attempt.workload_id]
            if workload.opted_in and ending.native_state:
                tail = partial(output_tail, workload, transport) if transport else None
                new += len(check_job_ending(workload, attempt, ending, now, tail))
            Attempt.objects.filter(pk=attempt.pk).update(ending_to_judge=None)
    return new


def _check_progress(
    workloads: list[Workload], now: datetime, summary: WorkloadsSummary
) -> dict[int, datetime | None]:
    """The checks due; returns, for each workload checked, when a check is next due if
    nothing new is read (``ProgressCheck.recheck_at``)."""
    due = [w for w in workloads if _progress_check_due(w, now)]
    rechecks: dict[int, datetime | None] = {}
    for workload in due:
        with transaction.atomic():
            check = run_progress_check(workload, now)
        summary.anomalies_new += len(check.created)
        rechecks[workload.pk] = check.recheck_at
    if due:
        Workload.objects.filter(pk__in=[w.pk for w in due]).update(progress_checked_at=now)
        for workload in due:
            workload.progress_checked_at = now
    summary.progress_checks += len(due)
    return rechecks


def _next_check_at(workload: Workload, now: datetime) -> datetime:
    """The first moment ``_progress_check_due`` can say a check is due, nothing else changing."""
    if not workload.opted_in or workload.state != WorkloadState.RUNNING:
        return now + held.HELD_FOR
    every, timeout = _check_cadence(workload)
    checked = workload.progress_checked_at
    if checked is None or checked > now:
        return now
    due = checked + every
    if workload.last_progress_at is not None:
        due = min(due, workload.last_progress_at + timeout - HANG_NEAR)
    return due


def _check_cadence(workload: Workload) -> tuple[timedelta, timedelta]:
    """How often the workload's progress is checked, and its policy's hang timeout."""
    policy = policy_for(workload)
    timeout = timedelta(minutes=policy.hang_timeout_minutes)
    every = min(
        timedelta(seconds=PROGRESS_CHECK_SECONDS),
        timedelta(minutes=policy.straggler_window_minutes) / 6,
        timeout / 6,
    )
    return every, timeout


def _progress_check_due(workload: Workload, now: datetime) -> bool:
    """Every ``PROGRESS_CHECK_SECONDS``, or a sixth of the policy's straggler window or hang
    timeout when that is shorter; every poll once the workload's silence nears its hang
    timeout, so that a job that stopped printing is caught as soon as the timeout is reached."""
    if not workload.opted_in or workload.state != WorkloadState.RUNNING:
        return False
    every, timeout = _check_cadence(workload)
    checked = workload.progress_checked_at
    # A clock set back (or a replayed poll) must not hold the checks off for good.
    if checked is None or checked > now or now - checked >= every:
        return True
    if workload.last_progress_at is None:
        return False  # still starting: its grace is ten minutes at least
    return now - workload.last_progress_at >= timeout - HANG_NEAR
