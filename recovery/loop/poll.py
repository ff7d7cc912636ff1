"""Polling a scheduler: jobs become workloads and attempts, changes become audit events.

Level-triggered: each poll compares the scheduler's state now with what is stored and
records the difference, so a poll that is repeated, late or re-delivered changes nothing twice.
Slurm forgets a job's nodes when it is requeued, so each attempt's nodes are kept while it
runs. Slurm also resets a requeued job's submit time; a workload keeps the first one, and a
job id seen again with no restarts and another submit time is a new job (ids wrap around).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import operator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import Case, F, Q, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from recovery.audit.actors import Actor
from recovery.audit.live import announcements_batched
from recovery.audit.record import record_event
from recovery.choices import AttemptExitState, AuditKind, WorkloadState
from recovery.loop.anomalies import finish_awaited_attributions
from recovery.loop.gpu_checks import check_gpu_metrics, metric_store_of
from recovery.loop.logs import OnNode, attempts_by_node, ingest_node_kernel_logs
from recovery.loop.monitors import (
    OUT_OF_SERVICE_WORDS,
    SchedulerEnding,
    check_node,
    check_suspects,
)
from recovery.loop.policy import decide_pending, policies_read_once
from recovery.loop.workflows import workflow_of
from recovery.loop.workloads import process_workloads
from recovery.models import Attempt, Cluster, Node, Workload
from recovery.schedulers.base import (
    JobInfo,
    NodeInfo,
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

WORKLOAD_STATES = {
    "PENDING": WorkloadState.PENDING,
    "CONFIGURING": WorkloadState.RUNNING,
    "RUNNING": WorkloadState.RUNNING,
    "COMPLETING": WorkloadState.RUNNING,
    "SUSPENDED": WorkloadState.RUNNING,
    "COMPLETED": WorkloadState.COMPLETED,
    "CANCELLED": WorkloadState.CANCELLED,
    "FAILED": WorkloadState.FAILED,
    "NODE_FAIL": WorkloadState.FAILED,
    "TIMEOUT": WorkloadState.FAILED,
    "OUT_OF_MEMORY": WorkloadState.FAILED,
    "BOOT_FAIL": WorkloadState.FAILED,
    "DEADLINE": WorkloadState.FAILED,
    "PREEMPTED": WorkloadState.REQUEUED,
    "REQUEUED": WorkloadState.REQUEUED,
}
ATTEMPT_ENDINGS = {
    "COMPLETED": AttemptExitState.COMPLETED,
    "FAILED": AttemptExitState.FAILED,
    "NODE_FAIL": AttemptExitState.NODE_FAIL,
    "TIMEOUT": AttemptExitState.TIMEOUT,
    "DEADLINE": AttemptExitState.TIMEOUT,
    "OUT_OF_MEMORY": AttemptExitState.OUT_OF_MEMORY,
    "PREEMPTED": AttemptExitState.PREEMPTED,
    "CANCELLED": AttemptExitState.CANCELLED,
    "BOOT_FAIL": AttemptExitState.FAILED,
}


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
FACTS_FOR_SYNC = ("state", "user", "submit_time", "restart_count", "held")

# Requeues while nobody looked that get an attempt of their own (``_record_unseen_attempts``).
UNSEEN_ATTEMPTS_RECORDED = 50


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


# ``monitors.out_of_service`` as a filter, so that only those nodes are read.
OUT_OF_SERVICE = functools.reduce(
    operator.or_,
    [Q(scheduler_state__icontains=word) for word in OUT_OF_SERVICE_WORDS],
    Q(scheduler_state__contains="*"),
)


# A node out of service is checked at once for an attempt that is new on it or when the node
# changed, and otherwise at most this often: a check that changed nothing records nothing new
# unless a workload on the node started failing meanwhile (a node that stops responding is
# then its cause).
NODE_RECHECK_SECONDS = 30.0
# (cluster, node, what of the node and which attempt was checked) -> when, kept by each worker
# process: a worker that has not seen it checks it, so losing this memory costs one check.
_NODES_CHECKED: dict[tuple[int, str, str], datetime] = {}
NODES_CHECKED_KEPT = 100_000


def _due_on_node(
    cluster: Cluster, node: Node, on_node: list[OnNode], now: datetime
) -> list[OnNode] | None:
    """The attempts on ``node`` to check now; None when nothing is due at all.

    ``node.updated_at`` tells a node of another life (another test, a re-created row) apart.
    """
    seen = repr((node.scheduler_state, node.state_reason, node.health, node.updated_at))
    fresh = timedelta(seconds=NODE_RECHECK_SECONDS)

    def due(key: tuple[int, str, str]) -> bool:
        last = _NODES_CHECKED.get(key)
        if last is not None and timedelta(0) <= now - last < fresh:
            return False
        _NODES_CHECKED[key] = now
        return True

    if len(_NODES_CHECKED) > NODES_CHECKED_KEPT:
        _NODES_CHECKED.clear()
    node_due = due((cluster.pk, node.name, seen))
    entries = [
        entry
        for entry in on_node
        if due((cluster.pk, node.name, f"{seen}|{entry[1].pk}|{entry[1].exit_state}|{entry[2]}"))
    ]
    if node_due:
        return on_node
    return entries or None


def _run_cluster_monitors(cluster: Cluster, now: datetime) -> int:
    """After the sources had their say: nodes out of service, suspected crashes settled.

    How each attempt ended and the hang and straggler checks are per workload
    (``recovery.loop.workloads``).
    """
    new = 0
    out = list(Node.objects.filter(cluster=cluster).filter(OUT_OF_SERVICE))
    on_nodes = attempts_by_node(cluster, now, {node.name for node in out}) if out else {}
    for node in out:
        due = _due_on_node(cluster, node, on_nodes.get(node.name, []), now)
        if due is None:
            continue
        with transaction.atomic():
            new += len(check_node(cluster, node, now, {node.name: due}))
    new += len(check_suspects(cluster, now))
    return new


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


# What ``_sync_nodes`` keeps of each node (``Node``'s fields).
NODE_SYNCED_FIELDS = (
    "scheduler_state",
    "state_flags",
    "state_reason",
    "reason_set_by",
    "reason_set_at",
    "unreadable",
)


def _node_fields(node: NodeInfo) -> dict[str, object]:
    """What ``Node`` keeps of ``node``: enough to tell whose node it is (``Node.as_read``).

    The state whole, with every flag; the reason and who set it when; and what could not be
    read. A state that could not be read is stored as none ("") and named in ``unreadable``:
    the monitors see no state to judge, and recovery neither drains nor resumes the node.
    """
    unreadable = {**node.unreadable, **node.unknown()}
    return {
        "scheduler_state": (
            "+".join([node.state, *node.flags])[:255] if node.state is not None else ""
        ),
        "state_flags": list(node.flags),
        "state_reason": (node.reason or "")[:255],
        "reason_set_by": node.reason_set_by[:64],
        "reason_set_at": node.reason_set_at,
        "unreadable": {name: why[:300] for name, why in sorted(unreadable.items())},
    }


def _comparable(fields: dict[str, object]) -> tuple[object, ...]:
    return tuple(
        repr(sorted(value.items())) if isinstance(value, dict) else repr(value)
        for value in (fields[name] for name in NODE_SYNCED_FIELDS)
    )


def _sync_nodes(cluster: Cluster, nodes: list[NodeInfo]) -> None:
    """Store the nodes as the scheduler reports them; only new nodes and changed ones are
    written."""
    stored = {
        row[0]: _comparable(dict(zip(NODE_SYNCED_FIELDS, row[1:], strict=True)))
        for row in Node.objects.filter(cluster=cluster).values_list("name", *NODE_SYNCED_FIELDS)
    }
    new: list[Node] = []
    changed: dict[tuple[object, ...], tuple[dict[str, object], list[str]]] = {}
    for node in nodes:
        wanted = _node_fields(node)
        key = _comparable(wanted)
        if node.name not in stored:
            new.append(Node(cluster=cluster, name=node.name, **wanted))
        elif stored[node.name] != key:
            changed.setdefault(key, (wanted, []))[1].append(node.name)
    with transaction.atomic():
        # Another worker may have added the same node a moment ago: it is the same row.
        Node.objects.bulk_create(new, ignore_conflicts=True)
        for wanted, names in changed.values():
            Node.objects.filter(cluster=cluster, name__in=names).update(
                **wanted, updated_at=timezone.now()
            )


WORK_DIR_LENGTH = 1024  # Workload.work_dir
# The jobs a workload keeps as the ones it waited for: a chain names one, rarely a few.
MAX_DEPENDS_ON = 16


def _sync_job(cluster: Cluster, job: JobInfo, now: datetime, digest: str) -> tuple[bool, bool, int]:
    """Upsert the job's workload and attempt; returns (created, state changed, workload id).

    An attempt this poll saw end abnormally keeps the scheduler's word on it
    (``Attempt.ending_to_judge``) for the monitors, once its output has been read.
    """
    workload = (
        Workload.objects.select_for_update()
        .filter(cluster=cluster, job_id=job.job_id)
        .order_by("-submit_time", "-id")
        .first()
    )
    created = False
    if workload is None or _is_another_job(workload, job):
        assert job.submit_time is not None  # a job with unknown facts is never synced
        workload = Workload.objects.create(
            cluster=cluster, job_id=job.job_id, submit_time=job.submit_time, state=""
        )
        created = True
    workload.name = job.name[:255]
    workload.user = job.user[:64]
    workload.partition = job.partition[:64]
    # Cut short it would name another account: one too long to keep binds nothing.
    workload.account = job.account if job.account and len(job.account) <= 64 else ""
    workload.opted_in = job.opt_in.opted_in
    workload.opt_in_error = job.opt_in.reason[:255]
    workload.opt_in_settings = job.opt_in.settings
    workload.environment = job.opt_in.environment or cluster.environment
    workload.opt_in_mode = job.opt_in.mode
    workload.workflow_ignored = job.opt_in.workflow_ignored[:255]
    # Kept once seen: Slurm stops showing a dependency when it is satisfied. Unknown adds none.
    for job_id in job.chained_after or ():
        if job_id not in workload.depends_on:
            workload.depends_on = [*workload.depends_on, job_id][-MAX_DEPENDS_ON:]
    workload.workflow = workflow_of(workload, job.opt_in.workflow)
    if job.stdout_path:
        workload.stdout_path = job.stdout_path[:1024]
    if job.stderr_path:
        workload.stderr_path = job.stderr_path[:1024]
    # Whose files the output may be, as the scheduler says now: an unknown uid reads nothing.
    workload.user_uid = job.user_uid
    if job.work_dir:
        # Cut short, it would name another directory: one too long to keep confines nothing.
        workload.work_dir = job.work_dir if len(job.work_dir) <= WORK_DIR_LENGTH else ""

    assert job.restart_count is not None
    number = job.restart_count + 1
    attempt, new_attempt = Attempt.objects.get_or_create(workload=workload, number=number)
    if new_attempt:
        # Only the poll makes attempts, so a gap below this one can only have opened now.
        _record_unseen_attempts(workload, number)
    if number > 1:
        _close_earlier_attempts(workload, number, now)
    was_running = attempt.exit_state == AttemptExitState.RUNNING
    _update_attempt(attempt, job)
    if (
        was_running
        and job.opt_in.opted_in
        and attempt.exit_state
        not in (AttemptExitState.RUNNING, AttemptExitState.COMPLETED, AttemptExitState.CANCELLED)
    ):
        Attempt.objects.filter(pk=attempt.pk).update(
            ending_to_judge=SchedulerEnding.of(job).to_json()
        )

    new_state = _workload_state(job)
    # The stop's own ending, as the scheduler shows it: the job stays stopped, and says why.
    kept_stopped = (
        workload.state == WorkloadState.STOPPED
        and number == workload.current_attempt
        and new_state in ENDED_STATES
    )
    if kept_stopped:
        new_state = WorkloadState.STOPPED
    changed = new_state != workload.state
    if changed:
        record_event(
            cluster=cluster,
            workload=workload,
            attempt=number,
            kind=AuditKind.STATE_CHANGED,
            actor=Actor.POLLER,
            payload={
                "from": workload.state,
                "to": new_state,
                "scheduler_state": job.state,
                "reason": job.reason,
                "restart_count": job.restart_count,
                "nodes": job.nodes,
            },
        )
        if new_state == WorkloadState.RUNNING and number > 1:
            record_event(
                cluster=cluster,
                workload=workload,
                attempt=number,
                kind=AuditKind.RESTART_ALLOCATED,
                actor=Actor.POLLER,
                payload={"nodes": job.nodes, "excluded_nodes": job.excluded_nodes},
            )
        if new_state == WorkloadState.COMPLETED:
            record_event(
                cluster=cluster,
                workload=workload,
                attempt=number,
                kind=AuditKind.TRAINING_COMPLETED,
                actor=Actor.POLLER,
                payload={"exit_code": job.exit_code},
            )
    workload.state = new_state
    if not kept_stopped:
        workload.state_reason = job.reason[:255]
    workload.current_attempt = number
    workload.synced_facts = digest
    workload.save()
    return created, changed, workload.pk


# What a stopped job's attempt looks like to the scheduler once it ended.
ENDED_STATES = frozenset({WorkloadState.FAILED, WorkloadState.CANCELLED, WorkloadState.COMPLETED})


def _is_another_job(workload: Workload, job: JobInfo) -> bool:
    """A job id Slurm handed out again: no restarts, and a submit time of its own.

    Only called with both facts read: an unknown restart count is not "no restarts".
    """
    if job.restart_count != 0 or job.submit_time is None:
        return False
    return abs(job.submit_time - workload.submit_time) > timedelta(seconds=1)


def _workload_state(job: JobInfo) -> str:
    # Only synced jobs come here, and a job with unknown facts (FACTS_FOR_SYNC) is never synced.
    assert job.state is not None and job.restart_count is not None
    state = WORKLOAD_STATES.get(job.state, WorkloadState.UNKNOWN)
    if state == WorkloadState.PENDING and job.held:
        return WorkloadState.HELD
    if state == WorkloadState.PENDING and job.restart_count > 0:
        return WorkloadState.REQUEUED
    return state


def _update_attempt(attempt: Attempt, job: JobInfo) -> None:
    assert job.state is not None  # a job with unknown facts is never synced
    # Right after a requeue the job is still COMPLETING its previous allocation, with the
    # restart count already raised: until it starts again, its nodes and start time are the
    # previous attempt's.
    previous = (
        Attempt.objects.filter(workload=attempt.workload_id, number=attempt.number - 1)
        .only("started_at", "nodes")
        .first()
        if attempt.number > 1 and attempt.started_at is None
        else None
    )
    previous_start = previous.started_at if previous is not None else None
    started_anew = job.start_time is not None and (
        previous_start is None or job.start_time > previous_start
    )
    if attempt.number > 1 and attempt.started_at is None and job.state == "COMPLETING":
        # Slurm moves the start time at a requeue, before the old allocation has finished
        # completing: these are still the previous attempt's nodes, the only sight of them
        # when Slurm started and requeued it between two polls.
        started_anew = False
        if previous is not None and not previous.nodes and job.nodes:
            previous.nodes = job.nodes
            previous.save(update_fields=["nodes"])
    # Slurm forgets the nodes on requeue: keep them now. A job that ended still lists the
    # allocation it ended on, the only sight of it when the attempt started and ended between
    # two polls (what it printed names those nodes, and must be told from what the previous
    # attempt printed about its own).
    allocated = (
        job.state in {"RUNNING", "COMPLETING", "CONFIGURING"} or job.state in ATTEMPT_ENDINGS
    )
    if job.nodes and allocated and started_anew:
        attempt.nodes = job.nodes
    if job.excluded_nodes is not None:
        attempt.excluded_nodes = job.excluded_nodes
    if started_anew and job.state != "PENDING":
        attempt.started_at = attempt.started_at or job.start_time
    ending = ATTEMPT_ENDINGS.get(job.state)
    if ending is not None:
        attempt.exit_state = ending
        attempt.ended_at = job.end_time or attempt.ended_at
        attempt.exit_code = job.exit_code if job.exit_code is not None else job.exit_signal
    attempt.save()


def _record_unseen_attempts(workload: Workload, number: int) -> None:
    """Attempts Slurm started and requeued while nobody looked: they ran, so they count.

    Slurm requeues a job itself (a node failed, it was preempted) and raises the restart
    count; when that happens between two polls (workers down, a slow database), or before the
    job is first seen, the count jumps. The attempts in between get rows of their own, ended
    and without nodes or start time (the scheduler no longer tells them), so that the retry
    budget counts them and what they printed has an attempt to be filed under: read with the
    current attempt's output, the previous attempt's node failure would otherwise be taken
    for the current one's and restart a healthy job. At most ``UNSEEN_ATTEMPTS_RECORDED``
    of them, the newest.
    """
    lowest = max(1, number - UNSEEN_ATTEMPTS_RECORDED)
    if number <= lowest:
        return
    known = set(
        Attempt.objects.filter(
            workload=workload, number__gte=lowest, number__lt=number
        ).values_list("number", flat=True)
    )
    missing = [n for n in range(lowest, number) if n not in known]
    if missing:
        Attempt.objects.bulk_create(
            [
                Attempt(workload=workload, number=n, exit_state=AttemptExitState.REQUEUED)
                for n in missing
            ],
            ignore_conflicts=True,  # the row lock on the workload makes this rare, not wrong
        )


def _close_earlier_attempts(workload: Workload, number: int, now: datetime) -> None:
    """Attempts before the current one ended when the job was requeued, whatever we saw."""
    Attempt.objects.filter(
        Q(ended_at__isnull=True) | Q(exit_state=AttemptExitState.RUNNING),
        workload=workload,
        number__lt=number,
    ).update(
        ended_at=Coalesce("ended_at", Value(now)),
        exit_state=Case(
            When(exit_state=AttemptExitState.RUNNING, then=Value(AttemptExitState.REQUEUED)),
            default=F("exit_state"),
        ),
    )
