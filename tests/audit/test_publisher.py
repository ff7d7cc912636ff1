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
