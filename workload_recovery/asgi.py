"""ASGI entry point: HTTP through Django, WebSockets through Channels, both served by uvicorn.

Every HTTP request passes through BodyLimit first (workload_recovery/body_limit.py), which holds
each path to its body limit; it can refuse a body before it is read only because uvicorn hands
bodies over as they arrive.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "workload_recovery.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from console.routing import websocket_urlpatterns  # noqa: E402
from workload_recovery.body_limit import BodyLimit, BodyLimits  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": BodyLimit(django_asgi_app, BodyLimits.from_settings()),
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
