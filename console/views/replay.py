"""Replay a cluster's recorded decisions under the policies in force, or with a draft.

GET only, and read only: the form names how many days back, a saved policy to try in place of
its saved self (enabled or not, it is tried as if enabled) and a JSON object of settings to
change on it (``recovery.loop.replay_draft.draft_policy``). The replay (``recovery.loop.replay``)
decides again on the facts each decision kept; nothing is saved and nothing reaches a scheduler.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_http_methods

from console.access import console_view
from recovery.loop.replay_draft import DraftError
from recovery.loop.replay_view import (
    DEFAULT_DAYS,
    MAX_DAYS,
    MAX_OVERRIDES_CHARS,
    MIN_DAYS,
    DaysError,
    draft_to_try,
    parse_days,
    parse_overrides,
    replay_days,
)
from recovery.models import Cluster, Policy

AS_IN_FORCE = ""


def _policy_label(policy: Policy) -> str:
    scope = policy.cluster.name if policy.cluster else "every cluster"
    state = "" if policy.enabled else ", disabled"
    return f"{policy.name} ({scope}{state})"


class ReplayForm(forms.Form):
    days = forms.CharField(required=False, label="Days of history")
    policy = forms.ChoiceField(required=False, label="Policy to try")
    overrides = forms.CharField(
        required=False,
        label="Settings to change (JSON)",
        max_length=MAX_OVERRIDES_CHARS,
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
        help_text='Optional, e.g. {"max_attempts": 5, "drain_nodes": false}: set on the policy '
        "chosen, or on a new policy when none is.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.policies = {
            str(p.pk): p for p in Policy.objects.select_related("cluster").order_by("name", "pk")
        }
        choices = [(AS_IN_FORCE, "The policies in force")]
        choices += [(pk, _policy_label(p)) for pk, p in self.policies.items()]
        policy = self.fields["policy"]
        assert isinstance(policy, forms.ChoiceField)
        policy.choices = choices

    def clean_days(self) -> int:
        try:
            return parse_days(self.cleaned_data.get("days"))
        except DaysError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if "policy" not in data or "overrides" not in data:
            return data
        base = self.policies.get(data["policy"]) if data["policy"] else None
        try:
            data["draft"] = draft_to_try(base, parse_overrides(data["overrides"]))
        except DraftError as exc:
            self.add_error("overrides", str(exc))
        return data


@require_http_methods(["GET", "HEAD"])
@console_view("recovery.view_policy", "Replaying a policy")
def replay(request: HttpRequest, cluster_id: int) -> HttpResponse:
    cluster = get_object_or_404(Cluster, pk=cluster_id)
    asked = request.GET.copy()
    if not asked.get("days"):
        asked["days"] = str(DEFAULT_DAYS)
    form = ReplayForm(asked)
    replays = []
    draft = None
    days = DEFAULT_DAYS
    if form.is_valid():
        days, draft = form.cleaned_data["days"], form.cleaned_data["draft"]
        replays = replay_days([cluster], days, draft)
    return render(
        request,
        "console/replay.html",
        {
            "cluster": cluster,
            "form": form,
            "days": days,
            "draft": draft,
            "replays": replays,
            "min_days": MIN_DAYS,
            "max_days": MAX_DAYS,
        },
        status=200 if form.is_valid() else 400,
    )
