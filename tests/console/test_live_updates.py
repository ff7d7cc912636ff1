"""Audit events reach WebSocket consumers through the real channels-redis layer."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from pytest_django.fixtures import Settings as SettingsWrapper

from recovery.audit.record import record_event
from recovery.choices import AuditKind
from tests.factories import WorkloadFactory
from tests.live_sockets import connect_and_collect, use_private_redis_layer

pytestmark = pytest.mark.django_db(transaction=True, reset_sequences=True)


@pytest.fixture(autouse=True)
def private_channel_layer(settings: SettingsWrapper) -> None:
    use_private_redis_layer(settings)


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


def test_a_batch_of_events_reaches_each_channel_as_single_events(viewer: User) -> None:
    """
    GIVEN a workload's page open, and a batch of work that records five events of it and four
          of another workload, interleaved
    WHEN the batch ends (its events go to Redis as one message per group)
    THEN the page's socket receives that workload's five events, one message each, in order,
         and none of the other's
    """
    from recovery.audit.live import announcements_batched

    workload = WorkloadFactory()
    other = WorkloadFactory(cluster=workload.cluster)
    kinds = [AuditKind.DETECTED, AuditKind.ATTRIBUTED, AuditKind.CONFIRMED, AuditKind.RECOMMENDED]

    def record_batch() -> None:
        with announcements_batched():
            for number in range(5):
                for target in (workload, other) if number < 4 else (workload,):
                    record_event(
                        cluster=target.cluster,
                        workload=target,
                        attempt=number + 1,
                        kind=kinds[number % len(kinds)],
                        actor="policy",
                    )

    async def emit() -> None:
        from channels.db import database_sync_to_async

        await database_sync_to_async(record_batch)()

    connected, _, received = connect_and_collect(
        f"/ws/workloads/{workload.pk}/", viewer, emit, messages=5
    )
    assert connected
    assert [event["type"] for event in received[:5]] == ["audit.event"] * 5
    assert {event["workload_id"] for event in received[:5]} == {workload.pk}
    assert [event["kind"] for event in received[:5]] == [
        kinds[number % len(kinds)] for number in range(5)
    ]
    assert received[5] == {"type": "pong"}


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
