"""Driving the Console's live sockets in tests: the real consumers behind the URL router, on a
channel layer of each test's own."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import channel_layers
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from pytest_django.fixtures import Settings as SettingsWrapper

from console.routing import websocket_urlpatterns
from recovery.read.health import check_redis

application = URLRouter(websocket_urlpatterns)


def use_private_redis_layer(settings: SettingsWrapper) -> None:
    """The real channels-redis layer, under a prefix no other test shares."""
    if not check_redis().ok:
        pytest.fail(f"Redis does not answer at {settings.REDIS_URL}: run the tests with make test")
    layer = dict(settings.CHANNEL_LAYERS["default"])
    assert layer["BACKEND"] == "channels_redis.core.RedisChannelLayer"
    layer["CONFIG"] = {**layer["CONFIG"], "prefix": f"test-{uuid.uuid4().hex[:8]}"}
    settings.CHANNEL_LAYERS = {"default": layer}
    channel_layers.backends.clear()


def use_in_process_layer(settings: SettingsWrapper) -> None:
    """For sockets refused before they join a group: a refused consumer still holds a
    channel-layer read until the client hangs up, and cancelling a channels-redis read there is
    slow (it waits out the blocking pop) and, in an event loop's shutdown, has hung a whole run.
    What such tests check happens before any group is joined."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    channel_layers.backends.clear()


def connect_and_collect(
    path: str, user: Any, emit: Any, messages: int = 1
) -> tuple[bool, Any, list[dict[str, Any]]]:
    """Open a socket as ``user``; once accepted, run ``emit`` and collect the ``messages`` it
    causes and the answer to a ping. Returns whether it was accepted, the close code, the
    messages."""

    async def run() -> tuple[bool, Any, list[dict[str, Any]]]:
        communicator = WebsocketCommunicator(application, path)
        # What AuthMiddlewareStack would put there; types-channels' test scope has no such key.
        communicator.scope["user"] = user  # type: ignore[typeddict-unknown-key]
        connected, code = await communicator.connect(timeout=5)
        received: list[dict[str, Any]] = []
        if connected:
            await emit()
            for _ in range(messages):
                received.append(await communicator.receive_json_from(timeout=5))
            await communicator.send_json_to({"type": "ping"})
            received.append(await communicator.receive_json_from(timeout=5))
        # A consumer runs until the client hangs up, refused or not: end it here rather than
        # leave it to be cancelled by the event loop's shutdown.
        await communicator.disconnect(timeout=5)
        return connected, code, received

    return async_to_sync(run)()
