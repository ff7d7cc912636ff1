"""Audit events reach WebSocket consumers through the real channels-redis layer."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import channel_layers
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser, User
from pytest_django.fixtures import Settings as SettingsWrapper

from console.consumers import UNAUTHORISED_CLOSE_CODE
from console.routing import websocket_urlpatterns
from recovery.audit.record import record_event
from recovery.choices import AuditKind
from recovery.read.health import check_redis
from tests.factories import WorkloadFactory

pytestmark = pytest.mark.django_db(transaction=True, reset_sequences=True)

application = URLRouter(websocket_urlpatterns)


@pytest.fixture(autouse=True)
def private_channel_prefix(settings: SettingsWrapper) -> None:
    if not check_redis().ok:
        pytest.fail(f"Redis does not answer at {settings.REDIS_URL}: run the tests with make test")
    layer = dict(settings.CHANNEL_LAYERS["default"])
    assert layer["BACKEND"] == "channels_redis.core.RedisChannelLayer"
    layer["CONFIG"] = {**layer["CONFIG"], "prefix": f"test-{uuid.uuid4().hex[:8]}"}
    settings.CHANNEL_LAYERS = {"default": layer}
    channel_layers.backends.clear()


@pytest.fixture
def in_process_layer(settings: SettingsWrapper) -> None:
    """For sockets that are refused before they join a group: a refused consumer still holds a
    channel-layer read until the client hangs up, and cancelling a channels-redis read there is
    slow (it waits out the blocking pop) and, in an event loop's shutdown, has hung a whole run.
    What these tests check happens before any group is joined."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    channel_layers.backends.clear()


def connect_and_collect(path: str, user: Any, emit: Any) -> tuple[bool, Any, list[dict[str, Any]]]:
    async def run() -> tuple[bool, Any, list[dict[str, Any]]]:
        communicator = WebsocketCommunicator(application, path)
        # What AuthMiddlewareStack would put there; types-channels' test scope has no such key.
        communicator.scope["user"] = user  # type: ignore[typeddict-unknown-key]
        connected, code = await communicator.connect(timeout=5)
        received: list[dict[str, Any]] = []
        if connected:
            await emit()
            received.append(await communicator.receive_json_from(timeout=5))
            await communicator.send_json_to({"type": "ping"})
            received.append(await communicator.receive_json_from(timeout=5))
        # A consumer runs until the client hangs up, refused or not: end it here rather than
        # leave it to be cancelled by the event loop's shutdown.
        await communicator.disconnect(timeout=5)
        return connected, code, received

    return async_to_sync(run)()


def test_an_audit_event_reaches_the_fleet_channel(operator: User) -> None:
    workload = WorkloadFactory()

    async def emit() -> None:
        from channels.db import database_sync_to_async

        await database_sync_to_async(record_event)(
            cluster=workload.cluster,
            workload=workload,
            attempt=1,
            kind=AuditKind.DETECTED,
            actor="policy",
        )

    connected, _, received = connect_and_collect("/ws/live/", operator, emit)
    assert connected
    event, pong = received
    assert event["type"] == "audit.event"
    assert event["kind"] == AuditKind.DETECTED
    assert event["workload_id"] == workload.pk
    assert event["cluster"] == workload.cluster.name
    assert pong == {"type": "pong"}


def test_a_workload_channel_gets_that_workloads_events(viewer: User) -> None:
    workload = WorkloadFactory()
    other = WorkloadFactory()

    async def emit() -> None:
        from channels.db import database_sync_to_async

        for target in (other, workload):
            await database_sync_to_async(record_event)(
                cluster=target.cluster, workload=target, kind=AuditKind.RECOMMENDED, actor="policy"
            )

    connected, _, received = connect_and_collect(f"/ws/workloads/{workload.pk}/", viewer, emit)
    assert connected
    assert received[0]["workload_id"] == workload.pk


@pytest.mark.usefixtures("in_process_layer")
def test_anonymous_sockets_are_refused() -> None:
    async def emit() -> None:
        raise AssertionError("a refused socket must not receive events")

    connected, code, _ = connect_and_collect("/ws/live/", AnonymousUser(), emit)
    assert not connected
    assert code == UNAUTHORISED_CLOSE_CODE


@pytest.mark.usefixtures("in_process_layer")
def test_an_account_without_a_console_role_is_refused(outsider: User) -> None:
    """GIVEN a logged-in account in no Console role WHEN it opens a live socket THEN it is
    refused, as the pages refuse it."""

    async def emit() -> None:
        raise AssertionError("a refused socket must not receive events")

    for path in ("/ws/live/", f"/ws/workloads/{WorkloadFactory().pk}/"):
        connected, code, _ = connect_and_collect(path, outsider, emit)
        assert not connected, path
        assert code == UNAUTHORISED_CLOSE_CODE


def test_a_user_whose_role_is_taken_away_stops_receiving(viewer: User) -> None:
    """GIVEN a viewer watching the fleet WHEN an admin removes the viewer role THEN the next
    event closes the socket instead of reaching it."""
    workload = WorkloadFactory()

    async def run() -> tuple[str, Any]:
        from channels.db import database_sync_to_async

        communicator = WebsocketCommunicator(application, "/ws/live/")
        communicator.scope["user"] = viewer  # type: ignore[typeddict-unknown-key]
        connected, _ = await communicator.connect(timeout=5)
        assert connected
        await database_sync_to_async(viewer.groups.clear)()
        await database_sync_to_async(record_event)(
            cluster=workload.cluster, workload=workload, kind=AuditKind.DETECTED, actor="policy"
        )
        output = await communicator.receive_output(timeout=5)
        await communicator.disconnect(timeout=5)
        return output["type"], output.get("code")

    kind, code = async_to_sync(run)()
    assert kind == "websocket.close"
    assert code == UNAUTHORISED_CLOSE_CODE


def test_a_deactivated_user_stops_receiving(operator: User) -> None:
    workload = WorkloadFactory()

    async def run() -> tuple[str, Any]:
        from channels.db import database_sync_to_async

        communicator = WebsocketCommunicator(application, "/ws/live/")
        communicator.scope["user"] = operator  # type: ignore[typeddict-unknown-key]
        connected, _ = await communicator.connect(timeout=5)
        assert connected
        await database_sync_to_async(User.objects.filter(pk=operator.pk).update)(is_active=False)
        await database_sync_to_async(record_event)(
            cluster=workload.cluster, workload=workload, kind=AuditKind.DETECTED, actor="policy"
        )
        output = await communicator.receive_output(timeout=5)
        await communicator.disconnect(timeout=5)
        return output["type"], output.get("code")

    kind, code = async_to_sync(run)()
    assert kind == "websocket.close"
    assert code == UNAUTHORISED_CLOSE_CODE


def test_fresh_goodput_figures_reach_the_fleet_channel(operator: User) -> None:
    from datetime import UTC, datetime

    from recovery.audit.live import announce_snapshots

    async def emit() -> None:
        from channels.db import database_sync_to_async

        await database_sync_to_async(announce_snapshots)(datetime(2026, 11, 29, tzinfo=UTC), 3)

    connected, _, received = connect_and_collect("/ws/live/", operator, emit)
    assert connected
    assert received[0] == {
        "type": "insights.snapshot",
        "taken_at": "2026-11-29T00:00:00+00:00",
        "clusters": 3,
    }
    assert received[1] == {"type": "pong"}
