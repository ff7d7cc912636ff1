from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from recovery.roles import can_decide


def console(request: HttpRequest) -> dict[str, Any]:
    return {"can_decide": can_decide(request.user) if hasattr(request, "user") else False}
