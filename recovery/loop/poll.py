"""Polling a scheduler: jobs become workloads and attempts, changes become audit events.

Level-triggered: each poll compares the scheduler's state now with what is stored and
records the difference, so a poll that is repeated, late or re-delivered changes nothing twice.
Slurm forgets a job's nodes when it is requeued, so each attempt's nodes are kept while it
runs. Slurm also resets a requeued job's submit time; a workload keeps the first one, and a
job id seen again with no restarts and another submit time is a new job (ids wrap around).
What one job's sync writes is ``poll_jobs``'s; the nodes' sync and checks, ``poll_nodes``'s.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from datetime import datetime

from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from recovery.audit.actors import Actor
from recovery.audit.live import announcements_batched
from recovery.audit.record import record_event
from recovery.choices import AuditKind, WorkloadState
from recovery.loop.anomalies import finish_awaited_attributions
from recovery.loop.gpu_checks import check_gpu_metrics, metric_store_of
from recovery.loop.logs import ingest_node_kernel_logs
from recovery.loop.policy import decide_pending, policies_read_once
from recovery.loop.poll_jobs import _sync_job
from recovery.loop.poll_nodes import _run_cluster_monitors, _sync_nodes
from recovery.loop.workloads import process_workloads
from recovery.models import Cluster, Workload
from recovery.schedulers.base import (
    JobInfo,
    SchedulerAdapter,
    SchedulerError,
    Transport,
    describe_unknown,
)
from recovery.schedulers.registry import build_adapter
from recovery.sources.logs import (
    LogSource,
    LogSourceError,
    source_from_settings,
)

logger = logging.getLogger(__name__)

RECOVERY_KEYS = ('"nvidia-recovery"', '"recovery"')


@dataclass
class PollSummary:
    jobs_seen: int = 0
    workloads_created: int = 0
    state_changes: int = 0
    nodes_seen: int = 0
    ignored: int = 0
    log_bytes: int = 0
    # Output files not read because a confinement rule refused them (see ``output_files``).
    outputs_refused: int = 0
    anomalies_new: int = 0
    decisions: int = 0
    log_store_error: str = ""
    metric_store_error: str = ""
    # Jobs left as they were because a fact the poller needs could not be read: "job: why".
    unreadable: list[str] = field(default_factory=list)
    # Jobs listed with the same facts as at the last poll: nothing of theirs was written.
    unchanged: int = 0
    # The workloads whose output, endings and progress are for ``process_workloads``: this
    # poll's own (``poll_cluster``) or, split across workers, ``tasks.polling``'s.
    workload_ids: list[int] = field(default_factory=list)
    # The digest of the facts each of them was synced from (``synced_facts``).
    workload_facts: dict[int, str] = field(default_factory=dict)


# What the poller needs to tell which workload and attempt a job is and what state it is in.
# With one of them unknown the job's workload is neither created nor changed in that poll.
FACTS_FOR_SYNC = ("phase", "user", "submit_time", "restart_count", "held")


def adapter_for(cluster: Cluster) -> SchedulerAdapter:
    """The adapter the cluster's connection kind and settings describe (see the registry)."""
    return build_adapter(
        str(cluster.connection), cluster.connection_settings or {}, name=cluster.name
    )


def log_store_of(cluster: Cluster) -> LogSource | None:
    """The Loki or VictoriaLogs store the cluster's jobs log to, if its settings name one
    (``connection_settings["log_source"]``, as ``manage.py configure_signals`` saves it)."""
    try:
        return source_from_settings((cluster.connection_settings or {}).get("log_source"))
    except (LogSourceError, ValueError, TypeError) as error:
        logger.warning("log store settings of %s are unusable: %s", cluster.name, error)
        return None


def poll_cluster(
    cluster: Cluster,
    adapter: SchedulerAdapter | None = None,
    *,
    now: datetime | None = None,
    ingest_logs: bool = True,
    workloads: bool = True,
) -> PollSummary:
    """Sync the cluster once; a failed poll is recorded on the cluster, then raised as before.

    With ``workloads`` false only the snapshot is taken (the scheduler's listing synced, the
    nodes' kernel logs and GPU metrics read): the per-workload half
    (``recovery.loop.workloads``, for the workloads in ``summary.workload_ids``) and then
    ``judge_cluster`` are left to the caller.

    The Console reads ``last_poll_error`` to say the scheduler cannot be reached; the caller
    still decides what a failure means (the task logs a SchedulerError, anything else raises).
    """
    now = now or timezone.now()
    try:
        summary = _poll(cluster, adapter, now=now, ingest_logs=ingest_logs, workloads=workloads)
    except Exception as exc:  # whatever broke is shown on the cluster, then raised on
        _record_poll_failure(cluster, exc, now)
        raise
    _record_poll_success(cluster, now)
    return summary


POLL_ERROR_LENGTH = 500


def poll_failure_reason(exc: BaseException) -> str:
    """One line naming why the poll failed, short enough for ``Cluster.last_poll_error``."""
    text = " ".join(str(exc).split())
    # A SchedulerError's message already says what failed; anything else is a surprise, so
    # its type is the most useful word.
    if not isinstance(exc, SchedulerError) or not text:
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    if len(text) > POLL_ERROR_LENGTH:
        text = text[: POLL_ERROR_LENGTH - 1] + "…"
    return text


def _record_poll_failure(cluster: Cluster, exc: BaseException, now: datetime) -> None:
    # Conditional: a poll that started earlier but failed late must not mark a cluster that a
    # newer poll has already read successfully.
    try:
        Cluster.objects.filter(pk=cluster.pk).filter(
            Q(last_polled_at__isnull=True) | Q(last_polled_at__lte=now)
        ).update(last_poll_error=poll_failure_reason(exc), last_poll_error_at=now)
    except DatabaseError:
        # The poll's own exception matters more than the note about it: let that one raise.
        logger.exception("could not record the failed poll of %s", cluster.name)


def _record_poll_success(cluster: Cluster, now: datetime) -> None:
    Cluster.objects.filter(pk=cluster.pk).update(last_polled_at=now)
    # Only an error older than this poll is cleared: a failure seen since still stands.
    Cluster.objects.filter(pk=cluster.pk).exclude(last_poll_error_at__gt=now).update(
        last_poll_error="", last_poll_error_at=None
    )


def _poll(
    cluster: Cluster,
    adapter: SchedulerAdapter | None,
    *,
    now: datetime,
    ingest_logs: bool,
    workloads: bool,
) -> PollSummary:
    """One poll: the scheduler's snapshot, each signal source in turn, then the decisions.

    The order is the loop's (see ``recovery.loop``): the scheduler's snapshot first, a node's
    kernel log before the output of the jobs on it, and every source before the monitors, which
    judge what the sources did not say (how an attempt ended, a silence, a slow node).
    """
    with announcements_batched(), policies_read_once():
        return _poll_once(
            cluster, adapter or adapter_for(cluster), now=now, ingest_logs=ingest_logs,
            workloads=workloads,
        )  # fmt: skip


def _poll_once(
    cluster: Cluster,
    adapter: SchedulerAdapter,
    *,
    now: datetime,
    ingest_logs: bool,
    workloads: bool,
) -> PollSummary:
    summary = PollSummary()
    jobs = _read_snapshot(cluster, adapter, summary)
    summary.workload_facts = _sync_jobs(cluster, jobs, now, summary)
    summary.workload_ids = list(summary.workload_facts)
    if ingest_logs:
        _read_kernel_logs(cluster, adapter.transport, now, summary)
        _read_gpu_metrics(cluster, now, summary)
    if workloads:
        done = process_workloads(
            cluster,
            summary.workload_ids,
            adapter.transport,
            now,
            log_store=log_store_of(cluster),
            read_logs=ingest_logs,
        )
        summary.log_bytes += done.log_bytes
        summary.outputs_refused += done.outputs_refused
        summary.anomalies_new += done.anomalies_new
        summary.log_store_error = done.log_store_error
        new, summary.decisions = _judge_cluster(cluster, now)
        summary.anomalies_new += new
    return summary


def judge_cluster(cluster: Cluster, now: datetime | None = None) -> tuple[int, int]:
    """The poll's last steps, over the whole cluster: nodes out of service, suspected crashes
    settled, awaited verdicts, the pending decisions. Returns (anomalies new, decisions).

    ``poll_cluster`` takes them itself; split across workers (``tasks.polling``) they are a
    task of their own, beside the shards of workloads.
    """
    with announcements_batched(), policies_read_once():
        return _judge_cluster(cluster, now or timezone.now())


def _judge_cluster(cluster: Cluster, now: datetime) -> tuple[int, int]:
    new = _run_cluster_monitors(cluster, now)
    # Verdicts a worker killed after its read's commit never asked the provider for.
    finish_awaited_attributions(cluster.pk, now)
    return new, decide_pending(cluster, now)


def _read_snapshot(
    cluster: Cluster, adapter: SchedulerAdapter, summary: PollSummary
) -> list[JobInfo]:
    """The scheduler's jobs now; its nodes are stored on the way."""
    # Jobs first: their JSON tells the adapter the Slurm version, which says how to read nodes.
    jobs = adapter.list_jobs()
    nodes = adapter.list_nodes()
    _sync_nodes(cluster, nodes)
    summary.nodes_seen = len(nodes)
    return jobs


def synced_facts(cluster: Cluster, job: JobInfo) -> str:
    """A digest of everything a sync of ``job`` reads: equal digests, nothing to write."""
    facts = repr((job, cluster.environment))
    return hashlib.sha256(facts.encode(errors="replace")).hexdigest()


def _sync_jobs(
    cluster: Cluster, jobs: list[JobInfo], now: datetime, summary: PollSummary
) -> dict[int, str]:
    """Each job of ours becomes its workload and attempt; workloads no longer listed, unknown.

    Returns the workloads of the opted-in jobs listed (their output is read), each with the
    digest of the facts it is synced from. A job
    whose facts are those its workload was last synced from is not synced again: a sync of
    the same facts writes nothing (the poll is level-triggered), so it is skipped unread.
    """
    ours = [
        job
        for job in jobs
        if job.opt_in.opted_in or any(key in job.comment for key in RECOVERY_KEYS)
    ]
    newest = _newest_synced(cluster, [job.job_id for job in ours])
    opted_in: dict[int, str] = {}
    for job in ours:
        summary.jobs_seen += 1
        unknown = job.unknown(FACTS_FOR_SYNC)
        if unknown:
            said = describe_unknown(unknown)
            summary.ignored += 1
            summary.unreadable.append(f"job {job.job_id}: {said}")
            logger.warning("job %s left as it was: unknown %s", job.job_id, said)
            continue
        digest = synced_facts(cluster, job)
        stored = newest.get(job.job_id)
        if stored is not None and stored[1] == digest:
            summary.unchanged += 1
            workload_id = stored[0]
        else:
            try:
                with transaction.atomic():
                    created, changed, workload_id = _sync_job(cluster, job, now, digest)
            except IntegrityError:
                summary.ignored += 1  # another worker created it this instant; the next poll syncs
                continue
            summary.workloads_created += created
            summary.state_changes += changed
        if job.opt_in.opted_in:
            opted_in[workload_id] = digest
    summary.state_changes += _forget_vanished(cluster, {job.job_id for job in jobs})
    return opted_in


def _newest_synced(cluster: Cluster, job_ids: list[str]) -> dict[str, tuple[int, str]]:
    """The newest workload of each of ``job_ids`` (a reused job id has older ones) and the
    digest of the facts it was last synced from."""
    found: dict[str, tuple[int, str]] = {}
    rows = (
        Workload.objects.filter(cluster=cluster, job_id__in=job_ids)
        .order_by("job_id", "-submit_time", "-id")
        .values_list("job_id", "pk", "synced_facts")
    )
    for job_id, pk, digest in rows:
        found.setdefault(job_id, (pk, digest))
    return found


def _read_kernel_logs(
    cluster: Cluster, transport: Transport | None, now: datetime, summary: PollSummary
) -> None:
    """Nodes' kernel logs, before any job's output.

    Nodes first: an Xid in a node's kernel log is the cause a job's CUDA error shows.
    """
    if transport is None:
        return
    kernel = ingest_node_kernel_logs(cluster, transport, now=now)
    summary.log_bytes += kernel.bytes_read
    summary.anomalies_new += kernel.anomalies_new


def _read_gpu_metrics(cluster: Cluster, now: datetime, summary: PollSummary) -> None:
    """The GPUs' DCGM metrics, when the cluster names a metric store."""
    metric_store = metric_store_of(cluster)
    if metric_store is None:
        return
    gpus = check_gpu_metrics(cluster, *metric_store, now)
    summary.anomalies_new += gpus.anomalies_new
    if gpus.error:
        summary.metric_store_error = gpus.error
        logger.warning("metric store of %s: %s", cluster.name, gpus.error)


ACTIVE_STATES = (
    WorkloadState.PENDING,
    WorkloadState.RUNNING,
    WorkloadState.REQUEUED,
    WorkloadState.HELD,
)


def _forget_vanished(cluster: Cluster, listed: set[str]) -> int:
    """Active workloads whose job the scheduler no longer lists become unknown, once.

    Slurm forgets a finished job after MinJobAge; when its end was missed (polling was down),
    or the scheduler's state was reset, the workload must not stay "running" forever, watched
    for a hang that cannot be helped.
    """
    vanished = Workload.objects.filter(cluster=cluster, state__in=ACTIVE_STATES).exclude(
        job_id__in=listed
    )
    changed = 0
    for workload in vanished.select_related("cluster"):
        with transaction.atomic():
            record_event(
                cluster=cluster,
                workload=workload,
                attempt=workload.current_attempt or None,
                kind=AuditKind.STATE_CHANGED,
                actor=Actor.POLLER,
                payload={
                    "from": workload.state,
                    "to": WorkloadState.UNKNOWN,
                    "reason": "the scheduler no longer lists the job",
                },
            )
            workload.state = WorkloadState.UNKNOWN
            workload.state_reason = "no longer listed by the scheduler"
            workload.save(update_fields=["state", "state_reason", "updated_at"])
        changed += 1
    return changed
