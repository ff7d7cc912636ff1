"""An account that may not read the audit trail gets nothing from the live sockets: refused on
connect, and cut off at the next event once its role is taken away or it is deactivated (the
pages refuse it the same way)."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser, User
from pytest_django.fixtures import Settings as SettingsWrapper

from console.consumers import UNAUTHORISED_CLOSE_CODE
from recovery.audit.record import record_event
from recovery.choices import AuditKind
from tests.factories import WorkloadFactory
from tests.live_sockets import (
    application,
    connect_and_collect,
    use_in_process_layer,
    use_private_redis_layer,
)

pytestmark = pytest.mark.django_db(transaction=True, reset_sequences=True)


@pytest.fixture(autouse=True)
def private_channel_layer(settings: SettingsWrapper) -> None:
    use_private_redis_layer(settings)


@pytest.fixture
def in_process_layer(settings: SettingsWrapper) -> None:
    use_in_process_layer(settings)


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
