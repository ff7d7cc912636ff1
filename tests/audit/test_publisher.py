"""The live publisher hands rounds to a thread of its own: the caller never waits for Redis,
rounds arrive in the order they were handed over, and a Redis that stays away costs bounded
memory, not a stuck poll."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from recovery.audit import live


def message(number: int) -> live.SnapshotMessage:
    return {"type": "insights.snapshot", "taken_at": f"n{number}", "clusters": number}


def test_rounds_reach_redis_in_the_order_they_were_handed_over() -> None:
    """
    GIVEN a channel in a group, on the project's Redis channel layer
    WHEN sixty rounds are published one after the other
    THEN publishing returns before they are sent, and the channel receives all sixty in order
    """
    layer = get_channel_layer()
    assert layer is not None and type(layer).__module__.startswith("channels_redis")
    group = f"publisher-test-{time.monotonic_ns()}"

    async def join() -> str:
        channel = await layer.new_channel()
        await layer.group_add(group, channel)
        return channel

    channel = async_to_sync(join)()
    for number in range(60):
        live.publish_many([([group], message(number))])
    assert live.drain_published(timeout=10)

    async def receive_all() -> list[int]:
        return [(await layer.receive(channel))["clusters"] for _ in range(60)]

    assert async_to_sync(receive_all)() == list(range(60))


class SlowLayer:
    """A layer whose every send takes ``seconds``, as Redis does when it is away."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.sent: list[Any] = []

    async def group_send(self, group: str, message: Any) -> None:
        await asyncio.sleep(self.seconds)
        self.sent.append(message["clusters"])


def test_a_slow_redis_never_holds_the_caller_and_the_backlog_is_bounded(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """
    GIVEN a publisher whose sends each take a second, and room for five waiting rounds
    WHEN twenty rounds are handed over
    THEN handing over takes no time at all, five wait and the rest are dropped with a warning;
         what was kept is sent in order
    """
    monkeypatch.setattr(live, "MAX_PENDING_ROUNDS", 5)
    publisher = live._Publisher()
    layer = SlowLayer(0.2)
    started = time.monotonic()
    for number in range(20):
        publisher.hand_over(layer, [(["fleet"], message(number))])
    assert time.monotonic() - started < 0.1
    assert publisher.dropped == 15
    assert "live updates dropped" in caplog.text
    assert publisher.drain(timeout=5)
    assert layer.sent == [0, 1, 2, 3, 4]


def test_a_send_that_fails_is_logged_and_the_next_round_still_goes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class FailingOnce(SlowLayer):
        async def group_send(self, group: str, message: Any) -> None:
            if message["clusters"] == 0:
                raise ConnectionError("Redis went away")
            await super().group_send(group, message)

    publisher = live._Publisher()
    layer = FailingOnce(0)
    for number in range(3):
        publisher.hand_over(layer, [(["fleet"], message(number))])
    assert publisher.drain(timeout=5)
    assert layer.sent == [1, 2]
    assert "live update not delivered: insights.snapshot" in caplog.text


def event(number: int, workload_id: int | None = None) -> live.AuditEventMessage:
    return {
        "type": "audit.event",
        "event_id": number,
        "cluster": "c",
        "workload_id": workload_id,
        "kind": "detected",
        "actor": "policy",
        "occurred_at": f"t{number}",
    }


def test_a_rounds_events_go_to_each_group_as_one_message_in_order() -> None:
    """
    GIVEN a round of four events of two workloads, a snapshot, then two more events
    WHEN it is turned into sends
    THEN the fleet gets the first four as one message, the snapshot, then the last two as one;
         each workload group gets its own events (one alone is sent as it is); nothing is lost
         or reordered
    """
    round_: live.Round = [
        (["fleet", "workload.1"], event(1, 1)),
        (["fleet", "workload.2"], event(2, 2)),
        (["fleet", "workload.1"], event(3, 1)),
        (["fleet"], event(4)),
        (["fleet"], message(5)),
        (["fleet", "workload.1"], event(6, 1)),
        (["fleet"], event(7)),
    ]
    sends = live._by_group(round_)

    def numbers(sent: Any) -> list[int]:
        if sent["type"] == "audit.events":
            return [item["event_id"] for item in sent["events"]]
        return [sent.get("event_id", sent.get("clusters"))]

    assert [(group, sent["type"], numbers(sent)) for group, sent in sends] == [
        ("fleet", "audit.events", [1, 2, 3, 4]),
        ("workload.1", "audit.events", [1, 3, 6]),
        ("workload.2", "audit.event", [2]),
        ("fleet", "insights.snapshot", [5]),
        ("fleet", "audit.events", [6, 7]),
    ]


def test_a_long_round_is_cut_into_bounded_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "MAX_EVENTS_PER_MESSAGE", 3)
    sends: list[Any] = [
        sent for _, sent in live._by_group([(["fleet"], event(n)) for n in range(7)])
    ]
    assert [[item["event_id"] for item in sent["events"]] for sent in sends[:2]] == [
        [0, 1, 2],
        [3, 4, 5],
    ]
    assert sends[2] == event(6)
