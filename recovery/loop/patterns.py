"""Admin-edited detection patterns and policy overrides, turned into what the detectors take.

``DetectionPattern`` rows add signatures or replace built-in ones of the same name; a disabled
row with a built-in's name switches that built-in off. The resulting set is rebuilt only when
the rows change, because compiling the matcher is the expensive part.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Count, Max

from recovery.detection.linear_regex import example_lines
from recovery.detection.progress import ProgressParser
from recovery.detection.signature_set import SignatureSet
from recovery.detection.signatures import CATEGORY_PRIORITY, Signature
from recovery.models import DetectionPattern, Policy

_cached: tuple[tuple[int, datetime | None], SignatureSet] | None = None


def signature_from_row(row: DetectionPattern) -> Signature:
    return Signature(
        name=row.name,
        category=row.category,
        attribution=row.attribution,
        severity=row.severity,
        pattern=row.pattern,
        examples=tuple(example_lines(row.examples)),
        counter_examples=tuple(example_lines(row.counter_examples)),
        priority=CATEGORY_PRIORITY.get(row.category, 50),
        description=row.description,
        builtin=False,
        printed_by=row.printed_by,
    )


def active_signature_set() -> SignatureSet:
    """Built-in signatures with the admin's additions, replacements and switches applied."""
    global _cached
    version = DetectionPattern.objects.aggregate(count=Count("id"), changed=Max("updated_at"))
    key = (version["count"], version["changed"])
    if _cached is not None and _cached[0] == key:
        return _cached[1]
    rows = list(DetectionPattern.objects.all())
    signatures = SignatureSet.builtin().with_overrides(
        [signature_from_row(row) for row in rows if row.enabled],
        disabled=[row.name for row in rows if not row.enabled],
    )
    _cached = (key, signatures)
    return signatures


def progress_parser_for(policy: Policy | None) -> ProgressParser:
    """A progress parser with the policy's own progress and checkpoint patterns tried first."""
    if policy is None:
        return ProgressParser()
    return ProgressParser(
        progress_patterns=[policy.progress_pattern] if policy.progress_pattern else [],
        checkpoint_patterns=[policy.checkpoint_pattern] if policy.checkpoint_pattern else [],
    )
