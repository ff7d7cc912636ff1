"""The audit trail: filters, CSV export and permalinks."""

from __future__ import annotations

from dataclasses import replace
from urllib.parse import urlencode

from django.core.handlers.asgi import ASGIRequest
from django.http import Http404, HttpRequest, HttpResponse, QueryDict, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone

from console.access import console_view
from console.formatting import datetime_local, payload_items, pretty_payload, trail_query_params
from recovery.audit.export import acsv_lines, csv_filename, csv_lines
from recovery.audit.trail import (
    QUICK_RANGES,
    AuditFilters,
    Cursor,
    InvalidCursor,
    WorkloadRef,
    cursor_at,
    decode_cursor,
    events_page,
    find_event,
    neighbours,
)
from recovery.choices import AuditKind
from recovery.models import Cluster
from recovery.read.filters import AuditTrailFilterSet
from recovery.read.filters.fields import parse_instant

VIEW_AUDIT_PERMISSION = "recovery.view_auditevent"


def _trail_url(filters: AuditFilters, cursor: str | None = None, *, view: str = "audit") -> str:
    params = trail_query_params(filters)
    if cursor:
        params.append(("cursor", cursor))
    query = urlencode(params)
    return reverse(f"console:{view}") + (f"?{query}" if query else "")


def _form_values(params: QueryDict, filters: AuditFilters) -> dict[str, object]:
    """What the filter form shows again: the typed text even when it was ignored, so it can be
    fixed, and a valid date and time as the datetime-local input writes it."""

    def text(name: str) -> str:
        value = params.get(name, "")
        return value.strip() if isinstance(value, str) else ""

    def instant(name: str) -> str:
        typed = text(name)
        try:
            parsed = parse_instant(typed) if typed else None
        except ValueError:
            return typed
        if parsed is None or filters.quick_range:  # a quick range replaces From and To
            return ""
        return datetime_local(parsed)

    return {
        "cluster": filters.cluster,
        "workload": text("workload"),
        "kinds": filters.kinds,
        "actor": text("actor"),
        "from": instant("from"),
        "to": instant("to"),
        "range": filters.quick_range,
    }


@console_view(VIEW_AUDIT_PERMISSION, "Reading the audit trail")
def audit_trail(request: HttpRequest) -> HttpResponse:
    """Every event, newest first, filtered and paged by keyset; live on the newest page."""
    clusters = list(Cluster.objects.order_by("name").values_list("name", flat=True))
    filterset = AuditTrailFilterSet(request.GET, now=timezone.now())
    filters = filterset.audit_filters()
    cursor: Cursor | None = None
    cursor_problem = ""
    if token := request.GET.get("cursor", "").strip():
        try:
            cursor = decode_cursor(token)
        except InvalidCursor as error:
            cursor_problem = f"That page link cannot be read ({error}); showing the newest events."
    page = events_page(filters, cursor)
    if cursor is not None and page.is_newest:
        # Back at the top: drop the cursor from the address, so the live refresh (which
        # re-fetches this address) keeps showing the newest events as they arrive.
        return redirect(_trail_url(filters))
    for event in page.events:
        event.payload_items = payload_items(event.payload)  # type: ignore[attr-defined]
    return render(
        request,
        "console/audit.html",
        {
            "problems": filterset.problems,
            "invalid_fields": filterset.invalid_fields,
            "notes": filterset.notes,
            "filters": filters,
            "form": _form_values(request.GET, filters),
            "cursor_problem": cursor_problem,
            "page": page,
            "clusters": clusters,
            "kinds": AuditKind.choices,
            "quick_ranges": [
                (key, label, _trail_url(filters.with_quick_range(key)))
                for key, (label, _span) in QUICK_RANGES.items()
            ],
            "any_time_url": _trail_url(filters.with_quick_range("")),
            "newest_url": _trail_url(filters),
            "newer_url": _trail_url(filters, page.newer_cursor) if page.newer_cursor else "",
            "older_url": _trail_url(filters, page.older_cursor) if page.older_cursor else "",
            "export_url": _trail_url(filters, view="audit_csv"),
        },
    )


@console_view(VIEW_AUDIT_PERMISSION, "Reading the audit trail")
def audit_csv(request: HttpRequest) -> HttpResponseBase:
    """The events the trail's filters select, as a CSV file, streamed in bounded batches."""
    now = timezone.now()
    filterset = AuditTrailFilterSet(request.GET, now=now)
    if problems := filterset.problems:
        # An export wider than asked for would be worse than none: say what to fix instead.
        # (The page's own "Export CSV" link carries only filters that parsed.)
        lines = ["The export was not made; fix these filters and try again:"]
        lines += [f"- {problem.message}" for problem in problems]
        return HttpResponse(
            "\n".join(lines) + "\n", status=400, content_type="text/plain; charset=utf-8"
        )
    filters = filterset.audit_filters()
    if filters.quick_range:
        # Pin the end of a relative range, so the rows and the filename agree.
        filters = replace(filters, until=now)
    # Under ASGI Django reads a plain iterator whole before sending; an async one
    # streams. The test client and any WSGI server take the plain one.
    chunks = acsv_lines(filters) if isinstance(request, ASGIRequest) else csv_lines(filters)
    response = StreamingHttpResponse(chunks, content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{csv_filename(filters, now)}"'
    response["Cache-Control"] = "no-store"
    return response


@console_view(VIEW_AUDIT_PERMISSION, "Reading the audit trail")
def audit_event(request: HttpRequest, event_id: int) -> HttpResponse:
    """One event in full, with its neighbours in the same workload for context."""
    event = find_event(event_id)
    if event is None:
        raise Http404("No audit event has this id.")
    nearby = neighbours(event)
    nearby_rows = [*nearby.before, event, *nearby.after]
    for row in nearby_rows:
        row.payload_items = payload_items(row.payload)  # type: ignore[attr-defined]
    cluster_filter = AuditFilters(cluster=event.cluster.name)
    return render(
        request,
        "console/audit_event.html",
        {
            "event": event,
            "payload": pretty_payload(event.payload),
            "has_payload": event.payload not in (None, "", {}, []),
            "nearby": nearby,
            "nearby_rows": nearby_rows,
            "cluster_trail_url": _trail_url(cluster_filter),
            "cluster_trail_here_url": _trail_url(cluster_filter, cursor_at(event))
            + f"#event-{event.pk}",
            "workload_trail_url": _trail_url(
                AuditFilters(workload=WorkloadRef(workload_id=event.workload_id))
            )
            if event.workload_id
            else "",
            "actor_trail_url": _trail_url(AuditFilters(actor=event.actor)),
            "kind_trail_url": _trail_url(AuditFilters(kinds=(event.kind,))),
        },
    )
