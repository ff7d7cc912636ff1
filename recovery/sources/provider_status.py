"""The outcome of the latest call to the external attribution provider.

``recovery.loop.attribution`` writes it after each call; the health check, the cluster's status
and the readiness report read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.cache import cache
from django.db import DatabaseError
from django.utils import timezone

from recovery.choices import AuditKind
from recovery.models import AuditEvent

# The outcome of the latest call to the external attribution provider, written by
# ``recovery.loop.attribution``. The cache may be per process (the default local-memory cache), so a
# process that never called the provider falls back to the audit trail: every ATTRIBUTED event
# made with a provider configured names it and says whether the call failed.
ATTRIBUTION_CACHE_KEY = "wr:attribution:last"
_TRAIL_CACHE_KEY = "wr:attribution:trail"
_TRAIL_CACHE_SECONDS = 15
# How far back the audit trail is searched for the last call; older outcomes say little.
_TRAIL_WINDOW = timedelta(days=7)
NO_PROVIDER_REASON = "no provider configured"


@dataclass(frozen=True)
class AttributionStatus:
    """Whether attribution runs with its external provider or on built-in rules only."""

    provider: str | None
    degraded: bool
    reason: str
    checked_at: datetime | None = None

    @property
    def configured(self) -> bool:
        return self.provider is not None


def attribution_provider_host() -> str | None:
    """The host (and port) of the configured provider, or None when there is none."""
    url = getattr(settings, "ATTRIBUTION_PROVIDER_URL", "") or ""
    if not url:
        return None
    # Never the netloc: credentials in the URL must not reach the health check or the trail.
    parts = urlsplit(url)
    host = parts.hostname or "unparsable URL"
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{host}:{port}" if port else host


def remember_provider_outcome(
    *, host: str, ok: bool, reason: str, at: datetime
) -> AttributionStatus | None:
    """Store the outcome of a provider call; return the outcome it replaces, if known."""
    previous = _last_outcome(host)
    cache.set(
        ATTRIBUTION_CACHE_KEY,
        {"host": host, "ok": ok, "reason": reason, "at": at.isoformat()},
        timeout=None,
    )
    cache.delete(_TRAIL_CACHE_KEY)
    return previous


def attribution_status() -> AttributionStatus:
    """Degraded when no provider is configured or the most recent call to it failed."""
    host = attribution_provider_host()
    if host is None:
        return AttributionStatus(None, True, NO_PROVIDER_REASON)
    last = _last_outcome(host)
    if last is None:
        return AttributionStatus(host, False, "configured; no recent call")
    return last


def _last_outcome(host: str) -> AttributionStatus | None:
    cached = cache.get(ATTRIBUTION_CACHE_KEY)
    if isinstance(cached, dict) and cached.get("host") == host:
        return _status_from(host, not cached.get("ok"), cached.get("reason"), cached.get("at"))
    trail = cache.get(_TRAIL_CACHE_KEY)
    if not (isinstance(trail, dict) and trail.get("host") == host):
        try:
            latest = _latest_provider_event(host)
        except DatabaseError:
            # The health check reports the database itself; this status stays unknown.
            return None
        trail = {"host": host, "event": latest}
        cache.set(_TRAIL_CACHE_KEY, trail, timeout=_TRAIL_CACHE_SECONDS)
    event = trail["event"]
    if event is None:
        return None
    return _status_from(host, event["degraded"], event["reason"], event["at"])


def _latest_provider_event(host: str) -> dict[str, Any] | None:
    event = (
        AuditEvent.objects.filter(
            kind=AuditKind.ATTRIBUTED,
            occurred_at__gte=timezone.now() - _TRAIL_WINDOW,
            payload__provider_host=host,
        )
        .order_by("-occurred_at", "-id")
        .only("payload", "occurred_at")
        .first()
    )
    if event is None:
        return None
    return {
        "degraded": bool(event.payload.get("degraded")),
        "reason": str(event.payload.get("degraded_reason", "")),
        "at": event.occurred_at.isoformat(),
    }


def _status_from(host: str, degraded: bool, reason: object, at: object) -> AttributionStatus:
    checked_at = datetime.fromisoformat(at) if isinstance(at, str) else None
    text = str(reason or "") or ("provider answered" if not degraded else "provider failing")
    return AttributionStatus(host, degraded, text, checked_at)
