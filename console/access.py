"""Who may see a Console page: signed in, and holding a Console role that grants the view."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponseBase

View = TypeVar("View", bound=Callable[..., HttpResponseBase])


def console_view(permission: str, what: str) -> Callable[[View], View]:
    """Anonymous readers are sent to log in; signed-in users without the permission get 403.

    ``what`` names the page in the refusal ("Viewing nodes needs a Console role ...").
    """

    def decorate(view: View) -> View:
        @wraps(view)
        def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if not request.user.has_perm(permission):
                raise PermissionDenied(f"{what} needs a Console role (viewer or above).")
            return view(request, *args, **kwargs)

        return login_required(guarded)  # type: ignore[return-value]

    return decorate
