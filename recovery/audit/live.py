"""The one publisher of live updates to the Console.

Payloads are small typed dicts; consumers fetch or render whatever they show from them.
Publishing never raises into the caller: a Console that is briefly not listening must not
make a scheduler action or a detection fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Literal, TypedDict

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

if TYPE_CHECKING:
    from recovery.models import AuditEvent

logger = logging.getLogger(__name__)

FLEET_GROUP = "fleet"


def workload_group(workload_id: int) -> str:
    return f"workload.{workload_id}"


class AuditEventMessage(TypedDict):
    type: Literal["audit.event"]
    event_id: int
    cluster: str
    workload_id: int | None
    kind: str
    actor: str
    occurred_at: str


class SnapshotMessage(TypedDict):
    type: Literal["insights.snapshot"]
    taken_at: str
    clusters: int


def announce_event(event: AuditEvent) -> None:
    announce_events([event])


_batches = threading.local()


@contextlib.contextmanager
def announcements_batched() -> Iterator[None]:
    """Events committed inside the block are announced together: when it ends, or once the
    batch is ``BATCH_SECONDS`` old at the next commit.

    For a batch of work that commits many small transactions (a shard of workloads): one round
    of sends instead of one per event. Only committed events reach the batch (announcements
    are made on commit), so a rolled-back one is never announced. Not nested: an inner block
    joins the outer one's batch.
    """
    if getattr(_batches, "events", None) is not None:
        yield
        return
    _batches.events = []
    _batches.since = time.monotonic()
    try:
        yield
    finally:
        _flush()
        _batches.events = None


# The longest a committed event waits in a batch: a live page is told within this of the commit
# (plus the send), however long the batch of work runs.
BATCH_SECONDS = 0.2


def _flush() -> None:
    events, _batches.events = _batches.events, []
    _batches.since = time.monotonic()
    publish_many([(_groups_of(event), _message_of(event)) for event in events])


def announce_events(events: list[AuditEvent]) -> None:
    """Each event to the fleet and to its workload's page, in one round of sends (or with the
    batch, inside ``announcements_batched``)."""
    batch = getattr(_batches, "events", None)
    if batch is None:
        publish_many([(_groups_of(event), _message_of(event)) for event in events])
        return
    batch.extend(events)
    if batch and time.monotonic() - _batches.since >= BATCH_SECONDS:
        _flush()


def _groups_of(event: AuditEvent) -> list[str]:
    groups = [FLEET_GROUP]
    if event.workload_id is not None:
        groups.append(workload_group(event.workload_id))
    return groups


def _message_of(event: AuditEvent) -> AuditEventMessage:
    return {
        "type": "audit.event",
        "event_id": event.pk,
        "cluster": event.cluster.name,
        "workload_id": event.workload_id,
        "kind": event.kind,
        "actor": event.actor,
        "occurred_at": event.occurred_at.isoformat(),
    }


def announce_snapshots(taken_at: datetime, clusters: int) -> None:
    """New goodput figures: pages that show them (fleet, insights) fetch themselves again."""
    message: SnapshotMessage = {
        "type": "insights.snapshot",
        "taken_at": taken_at.isoformat(),
        "clusters": clusters,
    }
    publish([FLEET_GROUP], message)


# How long a publisher waits for Redis to take one message before giving up on it.
PUBLISH_TIMEOUT_S = 5.0


Message = AuditEventMessage | SnapshotMessage


def publish(groups: list[str], message: Message) -> None:
    publish_many([(groups, message)])


def publish_many(messages: list[tuple[list[str], Message]]) -> None:
    layer = get_channel_layer()
    if layer is None or not messages:
        return

    async def send() -> None:
        for groups, message in messages:
            for group in groups:
                # Channels' stubs ask for a dict where any mapping does; a TypedDict is one.
                await layer.group_send(group, message)  # type: ignore[arg-type]

    try:
        loop = _publisher_loop(layer)
        if loop is None:
            async_to_sync(send)()
        else:
            asyncio.run_coroutine_threadsafe(send(), loop).result(timeout=PUBLISH_TIMEOUT_S)
    except Exception:
        kinds = sorted({message["type"] for _, message in messages})
        logger.warning("live update not delivered: %s", ", ".join(kinds), exc_info=True)


_publisher: tuple[int, asyncio.AbstractEventLoop] | None = None
_publisher_lock = threading.Lock()


def _publisher_loop(layer: object) -> asyncio.AbstractEventLoop | None:
    """One event loop per process that sends to a Redis channel layer, or None for another layer.

    ``async_to_sync`` runs each call in an event loop of its own, and channels-redis keeps its
    connections per loop: every message would open a connection to Redis (a few milliseconds,
    most of a poll's time when a read records hundreds of events). The loop's own thread keeps
    them open. An in-memory layer's queues belong to the loop that made them: it keeps
    ``async_to_sync``. A forked process (a Celery pool worker) starts a loop of its own.
    """
    global _publisher
    if not type(layer).__module__.startswith("channels_redis"):
        return None
    with _publisher_lock:
        if _publisher is None or _publisher[0] != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="live-publisher", daemon=True).start()
            _publisher = (os.getpid(), loop)
        return _publisher[1]
