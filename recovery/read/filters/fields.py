"""Form fields that read list parameters, and the django-filter filters built on them.

Two audiences read the same parameters. The API answers a bad value with a 400 that names it,
in the words its clients already know (``"x" is not a valid choice.``); the fields for it keep
those messages and rules. The Console shows a bad value as a problem on the page and ignores
it; its fields say in the operator's words what was ignored and why.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import django_filters
from django import forms
from django.core.exceptions import ValidationError
from django.core.validators import ProhibitNullCharactersValidator
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django_filters.fields import ChoiceField as FilterChoiceField

from recovery.audit.trail import MAX_ID, QUICK_RANGES, WorkloadRef
from recovery.choices import AuditKind
from recovery.models import Cluster, Workload

# ---------- the API's parameters ----------

CHOICE_ERRORS = {"invalid_choice": '"%(value)s" is not a valid choice.'}
_DATETIME_FORMAT = "YYYY-MM-DDThh:mm[:ss[.uuuuuu]][+HH:MM|-HH:MM|Z]"


class TextField(forms.CharField):
    """Text, trimmed. Only spaces is not a value but a mistake; too long says the limit."""

    default_error_messages = {
        "blank": "This field may not be blank.",
        "max_length": "Ensure this field has no more than %(limit_value)s characters.",
    }

    def clean(self, value: Any) -> Any:
        if isinstance(value, str) and value and not value.strip():
            raise ValidationError(self.error_messages["blank"], code="blank")
        return super().clean(value)


class IdField(forms.IntegerField):
    """A row id: a whole number from 1 to the largest BIGINT."""

    MAX_STRING_LENGTH = 1000
    default_error_messages = {
        "invalid": "A valid integer is required.",
        "max_string_length": "String value too large.",
    }

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", MAX_ID)
        super().__init__(**kwargs)

    def to_python(self, value: Any) -> int | None:
        if isinstance(value, str) and len(value) > self.MAX_STRING_LENGTH:
            raise ValidationError(
                self.error_messages["max_string_length"], code="max_string_length"
            )
        return super().to_python(value)


class FlagField(forms.Field):
    """``true``/``false`` in the usual spellings (``1``, ``yes``, ``on``…); ``null`` or nothing
    means "either"."""

    TRUE_VALUES = frozenset({"t", "y", "yes", "true", "on", "1"})
    FALSE_VALUES = frozenset({"f", "n", "no", "false", "off", "0"})
    NULL_VALUES = frozenset({"null", ""})
    default_error_messages = {"invalid": "Must be a valid boolean."}

    def to_python(self, value: Any) -> bool | None:
        if value is None:
            return None
        text = str(value).lower()
        if text in self.TRUE_VALUES:
            return True
        if text in self.FALSE_VALUES:
            return False
        if text in self.NULL_VALUES:
            return None
        raise ValidationError(self.error_messages["invalid"], code="invalid")


class InstantField(forms.Field):
    """An ISO 8601 date and time as UTC; one without an offset is taken to be UTC already."""

    default_error_messages = {
        "invalid": "Datetime has wrong format. Use one of these formats instead: %(format)s.",
        "overflow": "Datetime value out of range.",
    }

    def to_python(self, value: Any) -> datetime | None:
        if value in self.empty_values:
            return None
        try:
            parsed = parse_datetime(str(value))
        except ValueError:
            parsed = None
        if parsed is None:
            raise ValidationError(
                self.error_messages["invalid"], code="invalid", params={"format": _DATETIME_FORMAT}
            )
        if timezone.is_naive(parsed):
            return parsed.replace(tzinfo=UTC)
        try:
            return parsed.astimezone(UTC)
        except OverflowError:
            raise ValidationError(self.error_messages["overflow"], code="overflow") from None


class TextFilter(django_filters.CharFilter):
    field_class = TextField


class IdFilter(django_filters.Filter):
    field_class = IdField


class FlagFilter(django_filters.Filter):
    field_class = FlagField


class InstantFilter(django_filters.Filter):
    field_class = InstantField


class EnumFilter(django_filters.ChoiceFilter):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("error_messages", CHOICE_ERRORS)
        super().__init__(*args, **kwargs)


class EnumListFilter(django_filters.MultipleChoiceFilter):
    """Several values: repeat the parameter."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("error_messages", CHOICE_ERRORS)
        super().__init__(*args, **kwargs)


# ---------- the Console's parameters ----------

_EARLIEST_YEAR = 1970
_JOB_ID_MAX_LENGTH = Workload._meta.get_field("job_id").max_length or 64
_KIND_ORDER = {value: position for position, value in enumerate(AuditKind.values)}


def shorten(text: str, limit: int = 60) -> str:
    """Typed text quoted back in a message, cut to a readable length."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


class TrimmedChoiceField(FilterChoiceField):
    """A choice, read from text that may carry spaces around it."""

    def to_python(self, value: Any) -> str:
        return str(super().to_python(value)).strip()


class PlainTextField(forms.CharField):
    """Text, trimmed, matched as typed: even a NUL character simply matches nothing."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.validators = [
            validator
            for validator in self.validators
            if not isinstance(validator, ProhibitNullCharactersValidator)
        ]


class ClippedTextField(PlainTextField):
    """Text, trimmed and cut to ``max_length``: a longer value cannot match more."""

    def __init__(self, *, max_length: int, **kwargs: Any) -> None:
        self.clip_at = max_length
        super().__init__(**kwargs)

    def to_python(self, value: Any) -> str:
        return str(super().to_python(value))[: self.clip_at].strip()


class ClusterField(forms.ModelChoiceField):  # type: ignore[type-arg]
    """A cluster by name, which must exist (the Console names the unknown one).

    ``match_case`` also refuses a name that only the database's collation finds.
    """

    def __init__(self, *, match_case: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("queryset", Cluster.objects.all())
        kwargs.setdefault("to_field_name", "name")
        self.match_case = match_case
        super().__init__(**kwargs)

    def to_python(self, value: Any) -> Cluster | None:
        name = value.strip() if isinstance(value, str) else value
        if isinstance(name, str) and "\x00" in name:
            raise self._unknown(name)  # names no cluster, like any other unknown name
        cluster = super().to_python(name)
        if self.match_case and cluster is not None and cluster.name != name:
            raise self._unknown(name)
        return cluster

    def _unknown(self, name: object) -> ValidationError:
        return ValidationError(
            self.error_messages["invalid_choice"], code="invalid_choice", params={"value": name}
        )


class WorkloadRefField(forms.CharField):
    """``"123"`` (a workload id) or ``"lab:40001"`` (a job id on a cluster)."""

    def to_python(self, value: Any) -> WorkloadRef | None:  # type: ignore[override]
        text = str(super().to_python(value))
        if not text:
            return None
        if text.isdigit():
            workload_id = int(text)
            if not 0 < workload_id <= MAX_ID:
                raise ValidationError(
                    f"No workload can have the id {shorten(text)}; it is ignored.", code="invalid"
                )
            return WorkloadRef(workload_id=workload_id)
        cluster, colon, job_id = text.partition(":")
        cluster, job_id = cluster.strip(), job_id.strip()
        if colon and cluster and job_id and len(job_id) <= _JOB_ID_MAX_LENGTH:
            return WorkloadRef(cluster=cluster, job_id=job_id)
        raise ValidationError(
            f"“{shorten(text)}” is not a workload: use its number (e.g. 42) "
            "or cluster:job id (e.g. lab:40001). The workload filter is ignored.",
            code="invalid",
        )


class KindsField(forms.Field):
    """Audit event kinds, from repeated and comma-separated values, in ``AuditKind`` order.

    An unknown kind is reported and left out, and the known ones still apply: after a failed
    ``clean`` they are in ``known``.
    """

    widget = forms.MultipleHiddenInput

    def __init__(self, **kwargs: Any) -> None:
        self.known: tuple[str, ...] = ()
        super().__init__(**kwargs)

    def to_python(self, value: Any) -> tuple[str, ...]:
        values: Iterable[str] = value if isinstance(value, list | tuple) else [value or ""]
        wanted: set[str] = set()
        unknown: list[str] = []
        for part in (part.strip() for text in values for part in str(text).split(",")):
            if part in _KIND_ORDER:
                wanted.add(part)
            elif part and part not in unknown:
                unknown.append(part)
        self.known = tuple(sorted(wanted, key=_KIND_ORDER.__getitem__))
        if unknown:
            raise ValidationError(
                [
                    ValidationError(
                        f"There is no event kind “{shorten(kind)}”; it is ignored.", code="invalid"
                    )
                    for kind in unknown
                ]
            )
        return self.known


def parse_instant(text: str) -> datetime:
    """An ISO 8601 date and time, as UTC; one without an offset is taken to be UTC already."""
    try:
        value = datetime.fromisoformat(text)
        value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except (ValueError, OverflowError) as error:
        raise ValueError(f"not an ISO 8601 date and time: {text!r}") from error
    if value.year < _EARLIEST_YEAR:
        raise ValueError(f"before {_EARLIEST_YEAR}: {text!r}")
    return value


class TypedInstantField(forms.CharField):
    """A date and time as a datetime-local input sends it (see ``parse_instant``)."""

    def to_python(self, value: Any) -> datetime | None:  # type: ignore[override]
        text = str(super().to_python(value))
        if not text:
            return None
        try:
            return parse_instant(text)
        except ValueError:
            raise ValidationError(
                f"“{self.label}” is not a date and time: “{shorten(text)}” "
                "(expected YYYY-MM-DDTHH:MM in UTC). It is ignored.",
                code="invalid",
            ) from None


class QuickRangeField(forms.CharField):
    """A key of ``QUICK_RANGES``."""

    def to_python(self, value: Any) -> str:
        key = str(super().to_python(value))
        if key and key not in QUICK_RANGES:
            choices = ", ".join(QUICK_RANGES)
            raise ValidationError(
                f"“{shorten(key)}” is not a quick range (use {choices}); it is ignored.",
                code="invalid_choice",
            )
        return key


class TrimmedChoiceFilter(django_filters.ChoiceFilter):
    field_class = TrimmedChoiceField


class PlainTextFilter(django_filters.CharFilter):
    field_class = PlainTextField


class ClippedTextFilter(django_filters.CharFilter):
    field_class = ClippedTextField


class ClusterFilter(django_filters.Filter):
    field_class = ClusterField


class WorkloadRefFilter(django_filters.Filter):
    field_class = WorkloadRefField


class KindsFilter(django_filters.Filter):
    field_class = KindsField


class TypedInstantFilter(django_filters.Filter):
    field_class = TypedInstantField


class QuickRangeFilter(django_filters.Filter):
    field_class = QuickRangeField
