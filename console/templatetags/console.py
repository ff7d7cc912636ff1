"""Template filters for the Console."""

from __future__ import annotations

import json

from django import template

from recovery.choices import AnomalyKind, FailureCategory, RecommendationAction

register = template.Library()

_LABELS: dict[str, dict[str, str]] = {
    "category": dict(FailureCategory.choices),
    "kind": dict(AnomalyKind.choices),
    "action": dict(RecommendationAction.choices),
}


@register.filter
def choice_label(value: str | None, enum: str) -> str:
    """The human label of a stored choice, e.g. ``"gpu_oom"|choice_label:"category"``."""
    if not value:
        return ""
    return _LABELS[enum].get(value, value)


@register.filter
def as_json(value: object) -> str:
    """Compact JSON for payload values, instead of Python's repr."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
