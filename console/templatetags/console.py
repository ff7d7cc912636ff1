"""Template filters for the Console."""

from __future__ import annotations

import json
from datetime import datetime

from django import template
from django.utils import timezone
from django.utils.timesince import timesince

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


@register.filter
def duration(seconds: float | None) -> str:
    """Seconds as a short human duration ("2.0 s", "4 min 05 s", "3 h 20 min"); "—" if unknown."""
    if seconds is None:
        return "—"
    value = float(seconds)
    if value < 60:
        return f"{value:.1f} s"
    whole = round(value)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60:02d} min"
    return f"{whole // 86400} d {whole % 86400 // 3600:02d} h"


@register.filter
def percent(ratio: float | None) -> str:
    """A 0..1 ratio such as ETTR as "93.0 %"; "—" if unknown."""
    if ratio is None:
        return "—"
    return f"{float(ratio) * 100:.1f} %"


@register.filter
def get_item(mapping: dict[str, object] | None, key: str) -> object:
    """``mapping[key]``, or "" when absent: templates cannot index by a variable."""
    if not mapping:
        return ""
    return mapping.get(key, "")


@register.filter
def ago(moment: datetime | None) -> str:
    """How long ago, to the largest unit only ("4 hours ago"), so table cells stay one line."""
    if moment is None:
        return "—"
    if (timezone.now() - moment).total_seconds() < 60:
        return "just now"
    return f"{timesince(moment, depth=1)} ago"
