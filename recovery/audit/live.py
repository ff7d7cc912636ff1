"""The one publisher of live updates to the Console.

Payloads are small typed dicts; consumers fetch or render whatever they show from them.
Publishing never raises into the caller: a Console that is briefly not listening must not
make a scheduler action or a detection fail.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TypedDict

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


class AuditEventsMessage(TypedDict):
    """Several audit events of one round, for one group: consumers pass each on as an
    ``audit.event``, so clients never see this shape."""

    type: Literal["audit.events"]
    events: list[AuditEventMessage]


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


# How long the publisher waits for Redis to take one round of messages before giving up on it.
PUBLISH_TIMEOUT_S = 5.0
# Rounds handed to the publisher and not yet sent. Past this (Redis down or slow for long) new
# rounds are dropped and logged: live updates are a convenience, memory is not.
MAX_PENDING_ROUNDS = 2000
# At exit, how long a process waits for what it handed over to be sent.
DRAIN_AT_EXIT_S = 2.0

# The most events one ``audit.events`` message carries.
MAX_EVENTS_PER_MESSAGE = 200

Message = AuditEventMessage | SnapshotMessage
Round = list[tuple[list[str], Message]]


def publish(groups: list[str], message: Message) -> None:
    publish_many([(groups, message)])


def publish_many(messages: Round) -> None:
    """Send each message to its groups; never raises, and with Redis never waits for it.

    Over a Redis channel layer the round is handed to this process's publisher thread, which
    sends rounds in the order they were handed over: the caller (a shard of a poll, holding
    row locks) does not wait for Redis's round trips. Another layer is sent to at once.
    """
    layer = get_channel_layer()
    if layer is None or not messages:
        return
    try:
        publisher = _publisher_for(layer)
        if publisher is None:
            async_to_sync(_send)(layer, messages)
        else:
            publisher.hand_over(layer, messages)
    except Exception:  # a live update lost never fails the write it reports; the page reloads
        logger.warning("live update not delivered: %s", _kinds(messages), exc_info=True)


async def _send(layer: Any, messages: Round) -> None:
    for group, message in _by_group(messages):
        await layer.group_send(group, message)


def _by_group(messages: Round) -> list[tuple[str, Message | AuditEventsMessage]]:
    """The round as sends, in order: a group's consecutive audit events as one message.

    Each send is a few Redis round trips whoever listens, and a poll of a busy cluster
    announces a hundred events a second to the fleet: one send per event was most of what the
    worker's publisher did. A group still gets its messages in the order they were published.
    """
    sends: list[tuple[str, Message | list[AuditEventMessage]]] = []
    open_lists: dict[str, list[AuditEventMessage]] = {}
    for groups, message in messages:
        for group in groups:
            events = open_lists.get(group)
            if message["type"] != "audit.event":
                open_lists.pop(group, None)
                sends.append((group, message))
            elif events is None or len(events) >= MAX_EVENTS_PER_MESSAGE:
                open_lists[group] = [message]
                sends.append((group, open_lists[group]))
            else:
                events.append(message)
    return [(group, _as_message(sent)) for group, sent in sends]


def _as_message(sent: Message | list[AuditEventMessage]) -> Message | AuditEventsMessage:
    if not isinstance(sent, list):
        return sent
    if len(sent) == 1:
        return sent[0]
    return {"type": "audit.events", "events": sent}


def _kinds(messages: Round) -> str:
    return ", ".join(sorted({message["type"] for _, message in messages}))


class _Publisher:
    """An event loop on a thread of its own that sends the rounds handed to it, one at a time.

    ``async_to_sync`` runs each call in an event loop of its own, and channels-redis keeps its
    connections per loop: every message would open a connection to Redis (a few milliseconds,
    most of a poll's time when a read records hundreds of events). The loop's own thread keeps
    them open.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.rounds: asyncio.Queue[tuple[Any, Round]] | None = None
        self.pending = 0
        self.dropped = 0
        self.lock = threading.Lock()
        ready = threading.Event()
        threading.Thread(
            target=self._run, args=(ready,), name="live-publisher", daemon=True
        ).start()
        ready.wait()

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.rounds = asyncio.Queue()
        self.loop.create_task(self._send_rounds())
        ready.set()
        self.loop.run_forever()

    async def _send_rounds(self) -> None:
        assert self.rounds is not None
        while True:
            layer, messages = await self.rounds.get()
            try:
                await asyncio.wait_for(_send(layer, messages), PUBLISH_TIMEOUT_S)
            except Exception:  # one round lost, never the publisher's thread
                logger.warning("live update not delivered: %s", _kinds(messages), exc_info=True)
            finally:
                with self.lock:
                    self.pending -= 1
                self.rounds.task_done()

    def hand_over(self, layer: Any, messages: Round) -> None:
        with self.lock:
            if self.pending >= MAX_PENDING_ROUNDS:
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 1000 == 0:
                    logger.warning(
                        "live updates dropped: %d rounds waiting for Redis (%d dropped so far)",
                        self.pending,
                        self.dropped,
                    )
                return
            self.pending += 1
        assert self.rounds is not None
        self.loop.call_soon_threadsafe(self.rounds.put_nowait, (layer, list(messages)))

    def drain(self, timeout: float) -> bool:
        """Wait until every round handed over was sent or given up on; False on timeout."""
        assert self.rounds is not None
        done = asyncio.run_coroutine_threadsafe(self.rounds.join(), self.loop)
        try:
            done.result(timeout=timeout)
        except TimeoutError:
            return False
        return True


_publisher: tuple[int, _Publisher] | None = None
_publisher_lock = threading.Lock()


def _publisher_for(layer: object) -> _Publisher | None:
    """This process's publisher for a Redis channel layer, or None for another layer.

    An in-memory layer's queues belong to the loop that made them: it keeps ``async_to_sync``.
    A forked process (a Celery pool worker) starts a publisher of its own.
    """
    global _publisher
    if not type(layer).__module__.startswith("channels_redis"):
        return None
    with _publisher_lock:
        if _publisher is None or _publisher[0] != os.getpid():
            _publisher = (os.getpid(), _Publisher())
        return _publisher[1]


def drain_published(timeout: float = DRAIN_AT_EXIT_S) -> bool:
    """Wait until what this process handed to its publisher was sent; True when nothing waits."""
    with _publisher_lock:
        publisher = _publisher[1] if _publisher and _publisher[0] == os.getpid() else None
    return True if publisher is None else publisher.drain(timeout)


atexit.register(drain_published)
