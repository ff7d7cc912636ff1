"""Sign-in: Django's login views, refused for a while after too many failed attempts."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render

from console.forms import ConsoleLoginForm
from console.login_throttle import Lockout, client_address, lockout

ViewFunction = Callable[..., HttpResponseBase]


def refuse_when_locked(view: ViewFunction) -> ViewFunction:
    """Answer a sign-in past its account's or address's limit with 429, before the password
    is looked at; anything else goes to ``view``."""

    @wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if request.method == "POST":
            username = request.POST.get("username", "")
            locked = lockout(username, client_address(request))
            if locked is not None:
                return too_many_attempts(request, locked)
        return view(request, *args, **kwargs)

    return guarded


def too_many_attempts(request: HttpRequest, locked: Lockout) -> HttpResponse:
    retry_after = locked.retry_after_seconds()
    response = render(
        request,
        "registration/too_many_attempts.html",
        {"until": locked.until, "minutes": max(1, (retry_after + 59) // 60)},
        status=429,
    )
    response["Retry-After"] = str(retry_after)
    return response


console_login = refuse_when_locked(
    auth_views.LoginView.as_view(
        authentication_form=ConsoleLoginForm, redirect_authenticated_user=True
    )
)
