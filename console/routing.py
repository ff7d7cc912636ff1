"""The Console's WebSocket routes, served by Channels (see ``workload_recovery.asgi``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from django.urls import path

from console.consumers import LiveConsumer

if TYPE_CHECKING:
    from channels.routing import URLRouter, _ExtendedURLPattern

# Channels routes ASGI applications through Django's path(), which django-stubs types for views
# only; types-channels then wants, for URLRouter, patterns whose callback is an ASGI application,
# a type path() cannot return. Both are gaps between the two stub packages.
websocket_urlpatterns = cast(
    "list[_ExtendedURLPattern | URLRouter]",
    [
        path("ws/live/", LiveConsumer.as_asgi()),  # type: ignore[arg-type]
        path("ws/workloads/<int:workload_id>/", LiveConsumer.as_asgi()),  # type: ignore[arg-type]
    ],
)
