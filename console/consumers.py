"""WebSocket consumers: live updates for the Console.

A client joins only when logged in with a Console role that may read the audit trail (the pages
showing these events ask the same), and the user is checked again for every message, so a
session that is logged out, a user who is deactivated or one whose role is taken away stops
receiving updates at once.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.contrib.auth import get_user_model
from django.db.models import Q

from recovery.audit.live import (
    FLEET_GROUP,
    AuditEventMessage,
    AuditEventsMessage,
    SnapshotMessage,
    workload_group,
)

UNAUTHORISED_CLOSE_CODE = 4401
# What the live channels carry is audit events: the permission of the audit trail page.
LIVE_PERMISSION_APP, LIVE_PERMISSION_CODENAME = "recovery", "view_auditevent"


class LiveConsumer(AsyncJsonWebsocketConsumer):
    """Streams audit events (the whole fleet, or one workload when the URL names it) and, on the
    fleet channel, news of fresh goodput figures."""

    groups: list[str]

    async def connect(self) -> None:
        if not await self._user_may_watch():
            await self.close(code=UNAUTHORISED_CLOSE_CODE)
            return
        workload_id = self.scope["url_route"]["kwargs"].get("workload_id")
        self.live_group = workload_group(int(workload_id)) if workload_id else FLEET_GROUP
        await self.channel_layer.group_add(self.live_group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "live_group"):
            await self.channel_layer.group_discard(self.live_group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        # The channel is one-way; a ping is answered so clients can check it is alive.
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong"})

    async def audit_event(self, message: AuditEventMessage) -> None:
        await self._forward(dict(message))

    async def audit_events(self, message: AuditEventsMessage) -> None:
        """A round's events for this group, passed on one by one as the client expects them
        (the user is checked once for them all)."""
        await self._forward(*(dict(event) for event in message["events"]))

    async def insights_snapshot(self, message: SnapshotMessage) -> None:
        await self._forward(dict(message))

    async def _forward(self, *messages: dict[str, Any]) -> None:
        if not await self._user_may_watch():
            await self.close(code=UNAUTHORISED_CLOSE_CODE)
            return
        for message in messages:
            await self.send_json(message)

    @database_sync_to_async
    def _user_may_watch(self) -> bool:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            return False
        # One query, read fresh each time: Django's per-object permission cache would keep a
        # role that was taken away for as long as the socket stays open.
        granted = Q(
            user_permissions__content_type__app_label=LIVE_PERMISSION_APP,
            user_permissions__codename=LIVE_PERMISSION_CODENAME,
        ) | Q(
            groups__permissions__content_type__app_label=LIVE_PERMISSION_APP,
            groups__permissions__codename=LIVE_PERMISSION_CODENAME,
        )
        return (
            get_user_model()
            .objects.filter(pk=user.pk, is_active=True)
            .filter(Q(is_superuser=True) | granted)
            .exists()
        )
