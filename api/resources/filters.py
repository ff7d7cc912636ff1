"""Query parameters of each list, validated: a malformed value is a 400 that names it.

Each list is filtered by its FilterSet in ``recovery.read.filters``, the one the Console's list
pages read too, through django-filter's DRF backend. A bad value raises DRF's ValidationError,
which ``api.errors`` turns into the usual body (``fields`` names each bad parameter).

The OpenAPI schema lists each FilterSet's parameters with the limits its fields check (length,
range, choices), so that clients and the fuzz test know what a 400 refuses. drf-spectacular's
own django-filter extension guesses types from model fields and cannot see those limits.
"""

from __future__ import annotations

from typing import Any, TypeVar

from django import forms
from django_filters import Filter
from django_filters.rest_framework import DjangoFilterBackend
from django_filters.utils import translate_validation
from drf_spectacular.extensions import OpenApiFilterExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import build_choice_description_list, build_parameter_type
from drf_spectacular.utils import OpenApiParameter

from recovery.read.filters import ListFilterSet
from recovery.read.filters.fields import FlagField, InstantField

_INT32_MAX = 2**31 - 1
FilterSetT = TypeVar("FilterSetT", bound=ListFilterSet)


class ListFilterBackend(DjangoFilterBackend):
    """The view's ``filterset_class`` filters its list; a bad parameter is a 400."""


def validated(filterset: FilterSetT) -> FilterSetT:
    """The filterset, once its parameters are valid; a 400 naming the bad ones otherwise."""
    if not filterset.is_valid():
        # django-filter's stubs say it returns the errors; it returns DRF's ValidationError.
        raise translate_validation(filterset.errors)  # type: ignore[misc]
    return filterset


def _choices(filter_: Filter) -> list[tuple[str, str]]:
    return [(str(value), str(label)) for value, label in filter_.extra.get("choices", ())]


def parameter_schema(filter_: Filter) -> tuple[dict[str, Any], str]:
    """The OpenAPI schema of one parameter, and its description."""
    field = filter_.field
    help_text = str(field.help_text or "")
    if isinstance(field, forms.MultipleChoiceField):
        choices = _choices(filter_)
        item = {
            "enum": [value for value, _label in choices],
            "type": "string",
            "description": build_choice_description_list(choices),
        }
        return {"type": "array", "items": item}, help_text
    if isinstance(field, forms.ChoiceField):
        choices = _choices(filter_)
        schema = {"enum": [value for value, _label in choices], "type": "string", "minLength": 1}
        listing = build_choice_description_list(choices)
        return schema, "\n\n".join(text for text in (help_text, listing) if text)
    if isinstance(field, forms.IntegerField):
        schema = {"type": "integer", "maximum": field.max_value, "minimum": field.min_value}
        if isinstance(field.max_value, int) and field.max_value > _INT32_MAX:
            schema["format"] = "int64"
        return schema, help_text
    if isinstance(field, FlagField):
        return {"type": "boolean", "nullable": True}, help_text
    if isinstance(field, InstantField):
        return {"type": "string", "format": "date-time"}, help_text
    schema = {"type": "string", "minLength": 1}
    if isinstance(field, forms.CharField) and field.max_length is not None:
        schema["maxLength"] = field.max_length
    return schema, help_text


class ListFilterSchema(OpenApiFilterExtension):
    target_class = "api.resources.filters.ListFilterBackend"
    # Ahead of drf-spectacular's django-filter extension, which matches subclasses too.
    priority = 1

    def get_schema_operation_parameters(
        self, auto_schema: AutoSchema, *args: Any, **kwargs: Any
    ) -> list[dict[str, Any]]:
        filterset_class: type[ListFilterSet] | None = getattr(
            auto_schema.view, "filterset_class", None
        )
        if filterset_class is None:
            return []
        parameters = []
        for name, filter_ in filterset_class.base_filters.items():
            schema, description = parameter_schema(filter_)
            parameters.append(
                build_parameter_type(
                    name=name,
                    schema=schema,
                    location=OpenApiParameter.QUERY,
                    description=description or None,
                )
            )
        return parameters
