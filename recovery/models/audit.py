from __future__ import annotations

from typing import Any

from django.db import models
from django.utils import timezone

from recovery.choices import AuditKind
from recovery.models.cluster import Cluster
from recovery.models.workload import Workload


class AppendOnlyError(Exception):
    """Raised when code tries to change or remove an audit event."""


_REFUSAL = "audit events are append-only: they cannot be updated or deleted"


class AuditEventQuerySet(models.QuerySet["AuditEvent"]):
    def update(self, **kwargs: Any) -> int:
        raise AppendOnlyError(_REFUSAL)

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError(_REFUSAL)

    def bulk_update(self, objs: Any, fields: Any, batch_size: int | None = None) -> int:
        raise AppendOnlyError(_REFUSAL)

    def update_or_create(
        self, defaults: Any = None, create_defaults: Any = None, **kwargs: Any
    ) -> Any:
        raise AppendOnlyError(_REFUSAL)

    def _update(self, values: Any) -> int:
        # Model.save() goes through here for an UPDATE of an existing row.
        raise AppendOnlyError(_REFUSAL)

    def _raw_delete(self, using: str | None) -> int:
        raise AppendOnlyError(_REFUSAL)


class AuditEvent(models.Model):
    """One step in the audit trail. Rows are only ever inserted.

    The ORM refuses updates and deletes (instance and queryset); on MySQL/MariaDB two triggers
    refuse them in the database as well, so raw SQL cannot rewrite history either.
    """

    occurred_at = models.DateTimeField(default=timezone.now, db_index=True)
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="audit_events")
    workload = models.ForeignKey(
        Workload, on_delete=models.PROTECT, null=True, blank=True, related_name="audit_events"
    )
    attempt = models.PositiveIntegerField(null=True, blank=True)
    kind = models.CharField(max_length=32, choices=AuditKind.choices)
    actor = models.CharField(
        max_length=150, help_text="policy, watchdog, an operator's user name or a controller id"
    )
    payload = models.JSONField(default=dict, blank=True)

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        ordering = ["occurred_at", "id"]
        indexes = [
            models.Index(fields=["cluster", "occurred_at"]),
            # A cluster's trail workload by workload, in time order (cluster goodput).
            models.Index(fields=["cluster", "workload", "occurred_at"]),
            models.Index(fields=["workload", "occurred_at"]),
            models.Index(fields=["kind", "occurred_at"]),
            models.Index(fields=["actor", "occurred_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.occurred_at:%Y-%m-%d %H:%M:%S} {self.kind} by {self.actor}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise AppendOnlyError(_REFUSAL)
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError(_REFUSAL)
