"""Failures nothing explained, and teaching a detection pattern from one of their lines."""

from __future__ import annotations

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse

from console.access import console_view
from console.forms import TeachPatternForm
from console.views.operator_actions import operator, refused
from recovery.choices import FailureCategory
from recovery.detection.teaching import pattern_for_line, suggested_name
from recovery.loop.teaching import PatternDraft, TeachingPreview, preview_draft, teach
from recovery.models import Anomaly, Cluster
from recovery.read.unexplained import shown, unexplained_failures

UNEXPLAINED_PAGE_SIZE = 20
CHANGED_SINCE_PREVIEW = (
    "The pattern changed since its preview: check the preview below, then save it."
)


@console_view("recovery.view_anomaly", "Viewing unexplained failures")
def unexplained(request: HttpRequest) -> HttpResponse:
    """Confirmed deaths no signature explained, newest first, with the job's last lines."""
    cluster = request.GET.get("cluster", "")
    page = Paginator(unexplained_failures(cluster), UNEXPLAINED_PAGE_SIZE).get_page(
        request.GET.get("page")
    )
    return render(
        request,
        "console/unexplained.html",
        {
            "page": page,
            "failures": [shown(anomaly) for anomaly in page],
            "cluster": cluster,
            "clusters": Cluster.objects.order_by("name").values_list("name", flat=True),
        },
    )


def teach_pattern(request: HttpRequest, anomaly_id: int) -> HttpResponse:
    """GET: the form, prefilled from the chosen line. POST "preview": what the pattern would
    change; POST "save": the pattern stored, when its preview refuses nothing."""
    if answer := refused(request, "console:unexplained", "teach a detection pattern"):
        return answer
    anomaly = get_object_or_404(
        Anomaly.objects.select_related("workload__cluster", "attempt"),
        pk=anomaly_id,
        category=FailureCategory.UNEXPLAINED,
    )
    previewed: TeachingPreview | None = None
    if request.method == "POST":
        form = TeachPatternForm(request.POST)
        if form.is_valid():
            data = form.cleaned_data
            draft = PatternDraft(
                name=data["name"],
                pattern=data["pattern"],
                category=data["category"],
                attribution=data["attribution"],
                description=data["description"],
                printed_by=data["printed_by"].strip(),
            )
            if "save" in request.POST and data["previewed"] == draft.digest():
                taught = teach(anomaly, data["line"], draft, operator=operator(request))
                if taught.pattern is not None:
                    messages.success(
                        request,
                        f"Pattern {taught.pattern.name} saved: the detectors use it from their "
                        "next read.",
                    )
                    return redirect("console:unexplained")
                previewed = taught.previewed
            else:
                if "save" in request.POST:
                    messages.info(request, CHANGED_SINCE_PREVIEW)
                previewed = preview_draft(anomaly, data["line"], draft)
            _show_errors(form, previewed)
        line_index = _line_index(request.POST.get("line"))
    else:
        line_index = _line_index(request.GET.get("line"))
        form = TeachPatternForm(initial=_initial(anomaly, line_index))
    lines = anomaly.last_lines
    if not 0 <= line_index < len(lines):
        raise Http404("This failure has no such line.")
    may_save = previewed is not None and previewed.acceptable
    return render(
        request,
        "console/teach_pattern.html",
        {
            "failure": shown(anomaly),
            "line": lines[line_index],
            "line_index": line_index,
            "form": form,
            "previewed": previewed,
            "may_save": may_save,
            # What the preview shown is of: "save" saves only a draft that was previewed.
            "digest": previewed.draft.digest() if previewed is not None and may_save else "",
            "back": reverse("console:unexplained"),
        },
    )


def _line_index(value: str | None) -> int:
    try:
        return int(value or "")
    except ValueError:
        return -1


def _initial(anomaly: Anomaly, line_index: int) -> dict[str, object]:
    lines = anomaly.last_lines
    if not 0 <= line_index < len(lines):
        raise Http404("This failure has no such line.")
    line = lines[line_index]
    return {"line": line_index, "name": suggested_name(line), "pattern": pattern_for_line(line)}


def _show_errors(form: TeachPatternForm, previewed: TeachingPreview) -> None:
    """Put the preview's errors on the fields they concern."""
    for name, problems in previewed.errors.items():
        for problem in problems:
            form.add_error(name if name in form.fields else None, problem)
