"""An operator teaches a detection pattern from a line of a failure nothing explained.

The rules are ``recovery.detection.teaching``'s (the pattern derived from a line, the preview on
the labelled real cases, the refusals); this module feeds them what is stored (the labelled
cases under ``settings.LABELLED_CASES_DIR``, the other unexplained failures, the signatures the
detectors use now) and stores the pattern as a ``DetectionPattern`` row, with its audit event.
The detectors pick the row up as they do an admin's (``recovery.loop.patterns``).

What is saved is previewed again on the server, never taken from the page: a pattern the
preview refuses is never stored, whatever the form sent.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from recovery.audit.record import record_event
from recovery.choices import AuditKind, FailureCategory, Severity
from recovery.detection.evaluation import Case, CorpusError, load_cases
from recovery.detection.linear_regex import PatternError, compile_linear
from recovery.detection.teaching import Preview, Refusal, preview
from recovery.loop.patterns import active_signature_set, signature_from_row
from recovery.models import Anomaly, DetectionPattern

logger = logging.getLogger(__name__)

# The other unexplained failures a preview looks at: the newest, so a preview stays quick on a
# site with a long history.
OTHER_FAILURES = 500


@dataclass(frozen=True)
class PatternDraft:
    """What the operator asks to save: the fields of the teach form."""

    name: str
    pattern: str
    category: str
    attribution: str
    description: str = ""
    printed_by: str = ""

    def digest(self) -> str:
        """Identifies what a preview was of: saving needs the preview of the same draft."""
        fields = [self.name, self.pattern, self.category, self.attribution, self.printed_by]
        return hashlib.sha256(json.dumps(fields).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class TeachingPreview:
    """The preview of a draft, and everything that keeps it from being saved.

    ``errors`` are the model's own validation (``DetectionPattern.clean``: RE2, healthy lines,
    the selected line as its example) and the preview's refusals, by form field ("" for the
    draft as a whole). ``preview`` is None when the pattern could not be run at all.
    """

    draft: PatternDraft
    line: str
    preview: Preview | None
    errors: dict[str, list[str]] = field(default_factory=dict)
    cases_read: int = 0
    cases_problem: str = ""

    @property
    def acceptable(self) -> bool:
        return not self.errors


def labelled_cases(directory: Path | None = None) -> tuple[list[Case], str]:
    """The labelled real cases (every ``*.jsonl`` under the directory), and what kept them
    from being read ("" when nothing did)."""
    folder = Path(directory or settings.LABELLED_CASES_DIR)
    if not folder.is_dir():
        return [], f"no folder of labelled cases at {folder} (WR_LABELLED_CASES_DIR)"
    try:
        cases = load_cases(sorted(folder.rglob("*.jsonl")))
    except (CorpusError, OSError) as error:
        return [], f"the labelled cases cannot be read: {error}"
    if not cases:
        return [], f"no labelled case under {folder} (WR_LABELLED_CASES_DIR)"
    return cases, ""


def other_failures(anomaly: Anomaly) -> dict[int, Sequence[str]]:
    """The last lines of the other unexplained failures, newest first, by anomaly id."""
    others = (
        Anomaly.objects.filter(category=FailureCategory.UNEXPLAINED)
        .exclude(pk=anomaly.pk)
        .order_by("-detected_at", "-id")
        .only("pk", "details")[:OTHER_FAILURES]
    )
    return {other.pk: lines for other in others if (lines := other.last_lines)}


def row_for(draft: PatternDraft, line: str) -> DetectionPattern:
    """The unsaved row the draft would be, the selected line its example."""
    return DetectionPattern(
        name=draft.name,
        pattern=draft.pattern,
        category=draft.category,
        attribution=draft.attribution,
        severity=Severity.ERROR,
        description=draft.description,
        printed_by=draft.printed_by,
        examples=line,
        counter_examples="",
        enabled=True,
    )


def preview_draft(anomaly: Anomaly, line_index: int, draft: PatternDraft) -> TeachingPreview:
    """Validate ``draft`` as the model does, then preview it on the labelled cases and the
    other unexplained failures. ``line_index`` is the selected line among the failure's last
    lines; an index out of range is an error of the draft."""
    lines = anomaly.last_lines
    if not 0 <= line_index < len(lines):
        return TeachingPreview(draft, "", None, {"": ["Choose a line of this failure."]})
    line = lines[line_index]
    row = row_for(draft, line)
    errors: dict[str, list[str]] = {}
    try:
        row.full_clean()
    except ValidationError as invalid:
        for name, messages in invalid.message_dict.items():
            # The example is the selected line: a pattern that misses it is the pattern's fault.
            where = "pattern" if name == "examples" else name
            errors.setdefault("" if where == "__all__" else where, []).extend(messages)
    try:
        compile_linear(draft.pattern)
    except PatternError:
        return TeachingPreview(draft, line, None, errors)
    cases, problem = labelled_cases()
    found = preview(signature_from_row(row), active_signature_set(), cases, other_failures(anomaly))
    for refusal in found.refusals:
        errors.setdefault(refusal.field, []).append(refusal.message)
    return TeachingPreview(draft, line, found, errors, len(cases), problem)


@dataclass(frozen=True)
class Taught:
    pattern: DetectionPattern | None
    previewed: TeachingPreview


def teach(anomaly: Anomaly, line_index: int, draft: PatternDraft, *, operator: str) -> Taught:
    """Save ``draft`` as a detection pattern when its preview (made again here) refuses
    nothing, with a ``pattern_taught`` event naming the operator; else save nothing."""
    previewed = preview_draft(anomaly, line_index, draft)
    if not previewed.acceptable or previewed.preview is None:
        return Taught(None, previewed)
    found = previewed.preview
    workload = anomaly.workload
    try:
        with transaction.atomic():
            row = row_for(draft, previewed.line)
            row.save(force_insert=True)
            record_event(
                cluster=workload.cluster,
                workload=workload,
                attempt=anomaly.attempt.number if anomaly.attempt else None,
                kind=AuditKind.PATTERN_TAUGHT,
                actor=operator,
                payload={
                    "pattern_id": row.pk,
                    "name": row.name,
                    "pattern": row.pattern,
                    "category": row.category,
                    "attribution": row.attribution,
                    "anomaly": anomaly.pk,
                    "line": previewed.line,
                    "printed_by": row.printed_by,
                    "changed_cases": [case.id for case in found.changed],
                    "also_matches": [match.key for match in found.other_failures],
                },
            )
    except IntegrityError:  # the name taken meanwhile by another operator: save nothing
        logger.info("detection pattern %s was saved meanwhile by someone else", draft.name)
        taken = Refusal("name", "A detection pattern with this name was saved meanwhile.")
        errors = {taken.field: [taken.message]}
        return Taught(None, TeachingPreview(draft, previewed.line, found, errors))
    return Taught(row, previewed)
