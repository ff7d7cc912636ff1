"""The count of recommendations awaiting approval in the navigation (`views.approvals_count`)."""

from __future__ import annotations

from typing import Any

from django import template

from console.views.approvals_count import AwaitingApproval, awaiting_approval

register = template.Library()

VIEW_PERMISSION = "recovery.view_recommendation"


@register.simple_tag(takes_context=True)
def approvals_badge(context: template.Context) -> AwaitingApproval | None:
    """The count for a signed-in user whose role may see the approval queue; else ``None``."""
    user: Any = context.get("user")
    if user is None or not user.is_authenticated or not user.has_perm(VIEW_PERMISSION):
        return None
    return awaiting_approval()
