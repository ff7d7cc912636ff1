"""Cursor pages, newest first: stable while rows are added, and no COUNT over big tables.

``page_size`` (default 50, at most 500) sets the page length. Page links carry an opaque
``cursor``; a cursor the API did not make is a 400, not an empty page.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import QuerySet
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param
from rest_framework.views import APIView

from recovery.audit import trail as audit_trail

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
_DAMAGED = "The page cursor is damaged; follow the next and previous links as given."


class ResourcePagination(CursorPagination):
    page_size = DEFAULT_PAGE_SIZE
    page_size_query_param = "page_size"
    max_page_size = MAX_PAGE_SIZE
    ordering: Any = ("-id",)

    def get_ordering(self, request: Request, queryset: QuerySet[Any], view: APIView) -> Any:
        return getattr(view, "cursor_ordering", self.ordering)

    def get_page_size(self, request: Request) -> int:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None or raw == "":
            return self.page_size
        if not raw.isdigit() or int(raw) < 1:
            raise ValidationError(
                {"page_size": [f"A whole number from 1 to {self.max_page_size}."]},
                code="invalid_page_size",
            )
        return min(int(raw), self.max_page_size)

    def paginate_queryset(
        self,
        queryset: QuerySet[Any] | Sequence[Any],
        request: Request,
        view: APIView | None = None,
    ) -> list[Any] | None:
        assert isinstance(queryset, QuerySet), "a cursor page reads a queryset"
        self._model = queryset.model
        return super().paginate_queryset(queryset, request, view)

    def decode_cursor(self, request: Request) -> Cursor | None:
        try:
            cursor = super().decode_cursor(request)
        except NotFound:
            raise ValidationError({"cursor": [_DAMAGED]}, code="invalid_cursor") from None
        if cursor is not None and cursor.position is not None:
            # DRF puts the position into the query as it comes: check that it is a value of
            # the ordering field, or a crafted cursor would fail deep in the database.
            field = self._model._meta.get_field(self.ordering[0].lstrip("-"))
            try:
                field.to_python(cursor.position)
            except (DjangoValidationError, ValueError, TypeError):
                raise ValidationError({"cursor": [_DAMAGED]}, code="invalid_cursor") from None
        return cursor


class AuditEventPagination(ResourcePagination):
    """Pages of the audit trail through ``recovery.audit.trail``: its keyset query names the
    index that serves the filters (FORCE INDEX on MariaDB), which keeps a deep page of a
    million events at milliseconds. The view hands over its ``AuditFilters``; the queryset
    DRF passes in is not used."""

    ordering = audit_trail.NEWEST_FIRST

    def paginate_queryset(
        self,
        queryset: QuerySet[Any] | Sequence[Any],
        request: Request,
        view: APIView | None = None,
    ) -> list[Any] | None:
        self.request = request
        self.base_url = self._page_url = request.build_absolute_uri()
        self.page_size = self.get_page_size(request)
        raw = request.query_params.get(self.cursor_query_param)
        cursor = None
        if raw:
            try:
                cursor = audit_trail.decode_cursor(raw)
            except audit_trail.InvalidCursor:
                raise ValidationError({"cursor": [_DAMAGED]}, code="invalid_cursor") from None
        filters = getattr(view, "audit_filters", audit_trail.AuditFilters())
        page = audit_trail.events_page(filters, cursor, size=self.page_size)
        self._older, self._newer = page.older_cursor, page.newer_cursor
        return page.events

    def _link(self, cursor: str | None) -> str | None:
        if cursor is None:
            return None
        return replace_query_param(self._page_url, self.cursor_query_param, cursor)

    def get_next_link(self) -> str | None:
        return self._link(self._older)

    def get_previous_link(self) -> str | None:
        if self._newer is None:
            return None
        return self._link(self._newer)

    def get_paginated_response(self, data: Any) -> Response:
        return Response(
            {"next": self.get_next_link(), "previous": self.get_previous_link(), "results": data}
        )


__all__ = ["AuditEventPagination", "ResourcePagination"]
