"""How many recommendations await approval: the navigation's badge, and its JSON for live pages.

The badge is rendered with every page (``console.templatetags.approvals_badge``); a page keeps
it current by fetching ``approvals_count`` when the live channel announces an event of one of
``COUNT_CHANGING_KINDS`` (static/console/nav_badge.js).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from console.access import console_view
from recovery.choices import AuditKind
from recovery.read.queries import pending_approvals

# A bounded read on every page, never a table count: at most this many rows are counted.
BADGE_COUNT_LIMIT = 100
# The badge shows up to this number, then "99+".
BADGE_SHOWN_MAX = BADGE_COUNT_LIMIT - 1
# Events after which the count may have changed: a recommendation made (perhaps awaiting
# approval), approved, rejected, replaced by a newer one, or run out of time.
COUNT_CHANGING_KINDS = (
    AuditKind.RECOMMENDED,
    AuditKind.APPROVED,
    AuditKind.REJECTED,
    AuditKind.SUPERSEDED,
    AuditKind.EXPIRED,
)


@dataclass(frozen=True)
class AwaitingApproval:
    """The count of recommendations awaiting approval, read up to ``BADGE_COUNT_LIMIT``."""

    count: int

    @property
    def more(self) -> bool:
        """Whether there are more than the badge shows."""
        return self.count > BADGE_SHOWN_MAX

    @property
    def text(self) -> str:
        """What the badge shows: ``"3"``, ``"99+"``; nothing when none awaits."""
        if not self.count:
            return ""
        return f"{BADGE_SHOWN_MAX}+" if self.more else str(self.count)

    @property
    def label(self) -> str:
        """The badge's words for a screen reader and its tooltip."""
        if self.more:
            return f"more than {BADGE_SHOWN_MAX} awaiting approval"
        return f"{self.count} awaiting approval"

    @property
    def kinds(self) -> str:
        """The audit kinds that may change the count, as the page's script reads them."""
        return " ".join(COUNT_CHANGING_KINDS)


def awaiting_approval() -> AwaitingApproval:
    found = pending_approvals().order_by().values_list("pk", flat=True)[:BADGE_COUNT_LIMIT]
    return AwaitingApproval(count=len(found))


@console_view("recovery.view_recommendation", "Counting the recommendations awaiting approval")
@require_GET
@never_cache
def approvals_count(request: HttpRequest) -> JsonResponse:
    """``{"count": 3, "more": false, "text": "3", "label": "3 awaiting approval"}``; ``count``
    is at most ``BADGE_COUNT_LIMIT``."""
    badge = awaiting_approval()
    return JsonResponse(
        {"count": badge.count, "more": badge.more, "text": badge.text, "label": badge.label}
    )
