"""What every operator's button shares: signed in, allowed to decide, and back where it was."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from console.forms import DecisionForm
from recovery.roles import actor_name, can_decide


def refused(request: HttpRequest, home: str, what: str) -> HttpResponse | None:
    """The answer to a caller who may not press the button, or None for an operator.

    A signed-out caller logs in and lands on ``home``: the button's URL only takes POST.
    """
    if not request.user.is_authenticated:
        return redirect_to_login(reverse(home))
    if not can_decide(request.user):
        raise PermissionDenied(f"Only operators may {what}.")
    return None


def operator(request: HttpRequest) -> str:
    return actor_name(request.user)


def note_of(request: HttpRequest) -> str:
    form = DecisionForm(request.POST)
    return str(form.cleaned_data["note"]) if form.is_valid() else ""


def back(
    request: HttpRequest, home: str, message: str, *, changed: bool, level: int | None = None
) -> HttpResponse:
    """Say what happened, then return to the page the button was on (or ``home``).

    The message is a success when something changed, else information, unless ``level`` says.
    """
    if level is None:
        level = messages.SUCCESS if changed else messages.INFO
    messages.add_message(request, level, message)
    next_url = request.POST.get("next", "")
    if next_url and url_has_allowed_host_and_scheme(
        next_url, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return redirect(next_url)
    return redirect(home)
