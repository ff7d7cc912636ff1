from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from datetime import datetime

from django.db import models
from django.db.models import Max
from django.utils import timezone

from recovery.audit.actors import controller_actor
from recovery.models.cluster import Cluster

TOKEN_PREFIX = "wrc_"


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


class ControllerToken(models.Model):
    """A scheduler-side controller's credential, valid for one cluster only.

    Only a hash of the key is stored; the key itself is shown once, when it is issued.
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="controller_tokens")
    name = models.CharField(max_length=100, help_text="Names the controller in the audit trail.")
    key_prefix = models.CharField(max_length=12, editable=False)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["cluster", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="controller_token_name_unique")
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name} ({self.key_prefix}…)"

    @property
    def actor(self) -> str:
        return controller_actor(self.name)

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    @classmethod
    def issue(cls, cluster: Cluster, name: str) -> tuple[ControllerToken, str]:
        """Create a token and return it with its key, which is not stored anywhere."""
        raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(
            cluster=cluster, name=name, key_prefix=raw[:12], key_hash=hash_token(raw)
        )
        return token, raw

    @classmethod
    def last_seen_by_cluster(cls, cluster_ids: Iterable[int] | None = None) -> dict[int, datetime]:
        """Cluster id → when any of its unrevoked tokens last called in (one query); a cluster
        whose controllers never called in is absent."""
        tokens = cls.objects.filter(revoked_at__isnull=True, last_used_at__isnull=False)
        if cluster_ids is not None:
            tokens = tokens.filter(cluster_id__in=list(cluster_ids))
        rows = tokens.order_by().values("cluster_id").annotate(seen=Max("last_used_at"))
        return {row["cluster_id"]: row["seen"] for row in rows}

    @classmethod
    def authenticate(cls, raw: str) -> ControllerToken | None:
        if not raw.startswith(TOKEN_PREFIX) or len(raw) > 200:
            return None
        token = (
            cls.objects.select_related("cluster")
            .filter(key_hash=hash_token(raw), revoked_at__isnull=True)
            .first()
        )
        if token is not None:
            cls.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
        return token
