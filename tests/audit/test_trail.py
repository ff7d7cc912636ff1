"""The audit trail is append-only: every update and delete path fails, at the ORM and in MySQL."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction
from django.db.models import ProtectedError

from recovery.audit.record import record_event
from recovery.choices import AuditKind
from recovery.models import AppendOnlyError, AuditEvent
from tests.factories import ClusterFactory, WorkloadFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def event() -> AuditEvent:
    workload = WorkloadFactory()
    return record_event(
        cluster=workload.cluster,
        workload=workload,
        attempt=1,
        kind=AuditKind.DETECTED,
        actor="policy",
        payload={"category": "gpu_hardware"},
    )


def test_it_appends_events(event: AuditEvent) -> None:
    stored = AuditEvent.objects.get(pk=event.pk)
    assert stored.kind == AuditKind.DETECTED
    assert stored.payload == {"category": "gpu_hardware"}


def test_it_refuses_saving_an_existing_event(event: AuditEvent) -> None:
    event.actor = "somebody else"
    with pytest.raises(AppendOnlyError):
        event.save()
    assert AuditEvent.objects.get(pk=event.pk).actor == "policy"


def test_it_refuses_saving_a_fetched_event(event: AuditEvent) -> None:
    fetched = AuditEvent.objects.get(pk=event.pk)
    with pytest.raises(AppendOnlyError):
        fetched.save(update_fields=["actor"])


def test_it_refuses_queryset_update(event: AuditEvent) -> None:
    with pytest.raises(AppendOnlyError):
        AuditEvent.objects.filter(pk=event.pk).update(actor="rewritten")
    with pytest.raises(AppendOnlyError):
        AuditEvent.objects.all().update(kind=AuditKind.STOPPED)


def test_it_refuses_bulk_update(event: AuditEvent) -> None:
    event.actor = "rewritten"
    with pytest.raises(AppendOnlyError):
        AuditEvent.objects.bulk_update([event], ["actor"])


def test_it_refuses_instance_delete(event: AuditEvent) -> None:
    with pytest.raises(AppendOnlyError):
        event.delete()
    assert AuditEvent.objects.filter(pk=event.pk).exists()


def test_it_refuses_queryset_delete(event: AuditEvent) -> None:
    with pytest.raises(AppendOnlyError):
        AuditEvent.objects.filter(pk=event.pk).delete()
    with pytest.raises(AppendOnlyError):
        AuditEvent.objects.all().delete()
    assert AuditEvent.objects.count() == 1


def test_it_refuses_update_or_create(event: AuditEvent) -> None:
    with pytest.raises(AppendOnlyError):
        AuditEvent.objects.update_or_create(pk=event.pk, defaults={"actor": "x"})


def test_it_protects_events_from_cascading_deletes(event: AuditEvent) -> None:
    assert event.workload is not None
    with pytest.raises(ProtectedError):
        event.workload.delete()
    with pytest.raises(ProtectedError):
        event.cluster.delete()
    assert AuditEvent.objects.filter(pk=event.pk).exists()


def test_it_deletes_a_cluster_without_history() -> None:
    cluster = ClusterFactory()
    cluster.delete()


mysql_only = pytest.mark.skipif(
    connection.vendor != "mysql", reason="the database triggers exist on MySQL/MariaDB"
)


@mysql_only
def test_the_database_refuses_raw_update(event: AuditEvent) -> None:
    table = AuditEvent._meta.db_table
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(f"UPDATE {table} SET actor = %s WHERE id = %s", ["x", event.pk])
    assert AuditEvent.objects.get(pk=event.pk).actor == "policy"


@mysql_only
def test_the_database_refuses_raw_delete(event: AuditEvent) -> None:
    table = AuditEvent._meta.db_table
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(f"DELETE FROM {table} WHERE id = %s", [event.pk])
    assert AuditEvent.objects.filter(pk=event.pk).exists()


@mysql_only
def test_the_triggers_are_installed() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT TRIGGER_NAME, EVENT_MANIPULATION FROM information_schema.TRIGGERS "
            "WHERE EVENT_OBJECT_TABLE = %s AND TRIGGER_SCHEMA = DATABASE()",
            [AuditEvent._meta.db_table],
        )
        found = {row[1] for row in cursor.fetchall()}
    assert found == {"UPDATE", "DELETE"}
