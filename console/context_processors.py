from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from recovery.read.queries import unacknowledged_abandoned
from recovery.roles import can_decide
from recovery.sources.provider_status import NO_PROVIDER_REASON, attribution_status


def console(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    signed_in = bool(user is not None and user.is_authenticated)
    return {
        "can_decide": can_decide(user) if user is not None else False,
        # Only signed-in users see how attribution runs: the provider's trouble is internal.
        "attribution_warning": _attribution_warning() if signed_in else "",
        "abandoned_actions": _abandoned_actions() if signed_in else "",
    }


# The banner counts this many at most: a bounded read on every page, never a table count.
BANNER_COUNT_LIMIT = 100


def _abandoned_actions() -> str:
    found = len(unacknowledged_abandoned().values_list("pk", flat=True)[:BANNER_COUNT_LIMIT])
    if not found:
        return ""
    return (
        f"{BANNER_COUNT_LIMIT}+ actions"
        if found >= BANNER_COUNT_LIMIT
        else (f"{found} action{'s' if found > 1 else ''}")
    )


def _attribution_warning() -> str:
    status = attribution_status()
    if not status.degraded:
        return ""
    if status.reason == NO_PROVIDER_REASON:
        return "Attribution: built-in rules only — no external provider configured."
    return f"Attribution: built-in rules only — provider failing: {status.reason}"
