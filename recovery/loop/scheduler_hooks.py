"""What scheduler hooks push through the ingestion API: a job ended, a node went down.

A scheduler hook (Slurm's EpilogSlurmctld, a strigger program) may say that a job ended or a node
went down. That is not evidence by itself: it is recorded, and it asks for an immediate poll of
the cluster, which reads the scheduler's own state. The scheduler stays the source of truth, so a
late, repeated or wrong hook changes nothing a poll would not. The caller passes in how a poll
is queued (``tasks.polling.queue_poll``): the domain knows no task.

Kept apart from what jobs push (``push``): nothing of it is read by the detectors.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from recovery.audit.record import record_event
from recovery.choices import AuditKind
from recovery.loop.push import find_workload
from recovery.models import AuditEvent, Cluster, Node, Workload

logger = logging.getLogger(__name__)

# A pushed scheduler event is recorded but not used as evidence: the poll it triggers records
# what the scheduler says.
HOOK_EVENT_KIND = AuditKind.SCHEDULER_HOOK
HOOK_SOURCE = "scheduler_hook"
# A node-down hook repeated within this window (strigger re-arming, a flapping node) is one record.
NODE_DOWN_REPEAT_WINDOW = timedelta(minutes=10)
# Polls asked for by hooks are spread out: a thousand jobs ending together ask for one poll.
POLL_DEBOUNCE_MS = 1000

# Queues one poll of the cluster with this primary key; raises when it cannot.
QueuePoll = Callable[[int], object]


@dataclass(frozen=True)
class JobEnded:
    job_id: str
    state: str = ""
    exit_code: int | None = None
    exit_code_text: str = ""
    nodes: list[str] = field(default_factory=list)
    restart_count: int | None = None


@dataclass(frozen=True)
class NodeDown:
    node: str
    state: str = ""
    reason: str = ""


class HookStatus(StrEnum):
    """What became of a pushed scheduler event; the hook endpoints answer with the value."""

    # Written to the audit trail now.
    RECORDED = "recorded"
    # The same event was recorded before.
    DUPLICATE = "duplicate"
    # Nothing to record (the reason says why).
    IGNORED = "ignored"


@dataclass(frozen=True)
class HookOutcome:
    """What became of a pushed scheduler event, and why.

    In every case but a job that is not opted in, a poll of the cluster is asked for.
    """

    status: HookStatus
    reason: str
    poll_requested: bool
    workload: Workload | None = None
    event: AuditEvent | None = None


def record_job_ended(
    cluster: Cluster, ended: JobEnded, *, actor: str, queue_poll: QueuePoll
) -> HookOutcome:
    workload = find_workload(cluster, ended.job_id)
    if workload is None:
        # Perhaps a job too short for any poll to have seen: the poll will find it if it is ours.
        poll = request_poll(cluster, queue_poll)
        return HookOutcome(
            HookStatus.IGNORED, f"job {ended.job_id} is not known on cluster {cluster.name}", poll
        )
    if not workload.opted_in:
        return HookOutcome(
            HookStatus.IGNORED, f"job {ended.job_id} is not opted in to recovery", False, workload
        )
    key = f"job_ended:{ended.job_id}:{ended.restart_count}:{ended.state}:{ended.exit_code}"
    payload: dict[str, Any] = {
        "source": HOOK_SOURCE,
        "event": "job_ended",
        "key": key,
        "job_id": ended.job_id,
        "state": ended.state,
        "exit_code": ended.exit_code,
        "exit_code_text": ended.exit_code_text,
        "nodes": ended.nodes[:256],
        "restart_count": ended.restart_count,
        "note": "recorded only; the poll it triggers reads the job's state from the scheduler",
    }
    with transaction.atomic():
        Workload.objects.select_for_update().filter(pk=workload.pk).first()
        seen = AuditEvent.objects.filter(workload=workload, kind=HOOK_EVENT_KIND, payload__key=key)
        if seen.exists():
            return HookOutcome(
                HookStatus.DUPLICATE,
                "this job end was recorded before",
                request_poll(cluster, queue_poll),
                workload,
            )
        event = record_event(
            cluster=cluster,
            workload=workload,
            attempt=workload.current_attempt or None,
            kind=HOOK_EVENT_KIND,
            actor=actor,
            payload=payload,
        )
        poll = request_poll(cluster, queue_poll)
    return HookOutcome(HookStatus.RECORDED, "job end recorded", poll, workload, event)


def record_node_down(
    cluster: Cluster, down: NodeDown, *, actor: str, queue_poll: QueuePoll
) -> HookOutcome:
    node = Node.objects.filter(cluster=cluster, name=down.node).first()
    if node is None:
        return HookOutcome(
            HookStatus.IGNORED,
            f"node {down.node} is not known on cluster {cluster.name}",
            request_poll(cluster, queue_poll),
        )
    key = f"node_down:{down.node}:{down.state}:{down.reason}"[:512]
    with transaction.atomic():
        Cluster.objects.select_for_update().filter(pk=cluster.pk).first()
        recent = AuditEvent.objects.filter(
            cluster=cluster,
            kind=HOOK_EVENT_KIND,
            payload__key=key,
            occurred_at__gte=timezone.now() - NODE_DOWN_REPEAT_WINDOW,
        )
        if recent.exists():
            return HookOutcome(
                HookStatus.DUPLICATE,
                "this node state was recorded lately",
                request_poll(cluster, queue_poll),
            )
        event = record_event(
            cluster=cluster,
            kind=HOOK_EVENT_KIND,
            actor=actor,
            payload={
                "source": HOOK_SOURCE,
                "event": "node_down",
                "key": key,
                "node": down.node,
                "state": down.state,
                "reason": down.reason,
                "note": "recorded only; the poll it triggers reads the node's state from the "
                "scheduler",
            },
        )
        poll = request_poll(cluster, queue_poll)
    return HookOutcome(HookStatus.RECORDED, "node state recorded", poll, event=event)


def request_poll(cluster: Cluster, queue_poll: QueuePoll) -> bool:
    """Ask for a poll of the cluster once the current transaction commits.

    Returns whether one was asked for: only clusters with a scheduler behind them are polled.
    """
    if not cluster.is_polled:
        return False
    cluster_id = cluster.pk
    transaction.on_commit(lambda: enqueue_poll(cluster_id, queue_poll))
    return True


def enqueue_poll(cluster_id: int, queue_poll: QueuePoll) -> bool:
    """Queue a poll with ``queue_poll`` unless a hook queued one within POLL_DEBOUNCE_MS.

    Never raises: a hook must not fail because the broker is away; the beat polls anyway.
    """
    import redis

    try:
        first = redis.Redis.from_url(settings.REDIS_URL).set(
            f"wr:hook-poll:{cluster_id}", 1, nx=True, px=POLL_DEBOUNCE_MS
        )
        if not first:
            return False
        queue_poll(cluster_id)
    except Exception:  # a shortcut only: the next scheduled poll reads the job anyway
        logger.warning("could not queue a poll of cluster %s for a hook", cluster_id, exc_info=True)
        return False
    return True
