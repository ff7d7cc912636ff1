from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models

from recovery.choices import SIGNATURE_CATEGORIES, Attribution, Severity
from recovery.detection.linear_regex import (
    PatternError,
    check_examples,
    compile_linear,
    example_lines,
    healthy_lines_matched,
)

signature_name_validator = RegexValidator(
    r"^[a-z0-9][a-z0-9_.-]{0,127}$",
    "Use lower-case letters, digits, '.', '_' or '-'.",
)


class DetectionPattern(models.Model):
    """A failure signature edited in admin, added to the built-in ones or replacing one.

    The pattern runs on RE2 (linear time). It is only accepted when it compiles, matches every
    example line and matches none of the counter-examples.
    """

    name = models.CharField(
        max_length=128,
        unique=True,
        validators=[signature_name_validator],
        help_text="A built-in signature of the same name is replaced by this one.",
    )
    description = models.CharField(max_length=255, blank=True)
    pattern = models.TextField(help_text="RE2 syntax; no backreferences or lookaround.")
    category = models.CharField(
        max_length=32,
        choices=SIGNATURE_CATEGORIES,
    )
    attribution = models.CharField(max_length=32, choices=Attribution.choices)
    severity = models.CharField(max_length=16, choices=Severity.choices, default=Severity.ERROR)
    examples = models.TextField(help_text="Lines the pattern must match, one per line.")
    counter_examples = models.TextField(
        blank=True, help_text="Lines the pattern must not match, one per line."
    )
    printed_by = models.CharField(
        max_length=255,
        blank=True,
        help_text="The program that prints the line (and where known its documentation): a "
        "pattern that matches no other known failure must name it.",
    )
    enabled = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["category", "name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        super().clean()
        if self.attribution == Attribution.NONE:
            raise ValidationError(
                {"attribution": "A failure signature needs an attribution other than 'none'."}
            )
        if not self.pattern:
            return  # the required-field error is already reported
        try:
            compiled = compile_linear(self.pattern)
        except PatternError as exc:
            raise ValidationError({"pattern": str(exc)}) from None
        fires_on = healthy_lines_matched(compiled)
        if fires_on:
            shown = fires_on[0][:200] or "(an empty line)"
            raise ValidationError(
                {
                    "pattern": "The pattern matches a line that healthy training jobs print, "
                    f"so it would raise false alarms: {shown}"
                }
            )
        examples = example_lines(self.examples or "")
        if not examples:
            raise ValidationError({"examples": "Give at least one line the pattern must match."})
        errors: dict[str, list[str]] = {}
        for mismatch in check_examples(
            compiled, examples, example_lines(self.counter_examples or "")
        ):
            field, verb = (
                ("examples", "does not match")
                if mismatch.expected_match
                else ("counter_examples", "matches")
            )
            errors.setdefault(field, []).append(
                f"The pattern {verb} this line: {mismatch.line[:200]}"
            )
        if errors:
            raise ValidationError(errors)
