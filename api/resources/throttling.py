"""Request rates per caller: people by account, controllers, jobs and scheduler hooks by token,
each kind with its own budget, so a job spending its own cannot make the controller wait. Rates
come from settings (``WR_API_RATE``, ``WR_API_CONTROLLER_RATE``, ``WR_API_JOB_TOKEN_RATE``,
``WR_API_HOOK_TOKEN_RATE``).

Anonymous callers are not counted: every resource refuses them before throttles run (DRF checks
permissions first), and the health check must stay free for load balancers.

The counters live in the ``throttle`` cache (Redis, shared by every web process) when it is
configured, else in the default cache. A cache that cannot be reached lets the request through:
throttling protects the service, it must not be the reason the service is down.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, TypeGuard, cast

from django.core.cache import BaseCache, caches
from django.core.cache.backends.base import InvalidCacheBackendError
from rest_framework.request import Request
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

if TYPE_CHECKING:
    # DRF imports the throttle classes while it defines APIView: import nothing that needs it.
    from rest_framework.views import APIView

    from api.authentication import ControllerPrincipal, IngestPrincipal

logger = logging.getLogger(__name__)

THROTTLE_CACHE = "throttle"


def _is_controller(user: object) -> TypeGuard[ControllerPrincipal]:
    from api.authentication import ControllerPrincipal  # imports APIView: see above

    return isinstance(user, ControllerPrincipal)


def _is_ingest(user: object) -> TypeGuard[IngestPrincipal]:
    from api.authentication import IngestPrincipal  # imports APIView: see above

    return isinstance(user, IngestPrincipal)


class _SharedCacheThrottle(SimpleRateThrottle):
    # Every concrete throttle names its scope (DRF's base allows none).
    scope: str

    # DRF's stubs declare a writable attribute; a property is read-only, on purpose (see below).
    @property
    def cache(self) -> BaseCache:  # type: ignore[override]
        # Looked up per request: tests (and settings overrides) replace the cache handlers.
        try:
            return caches[THROTTLE_CACHE]
        except InvalidCacheBackendError:
            return caches["default"]

    def get_rate(self) -> str | None:
        # DRF reads the rates once, at import; reading them here lets settings overrides apply.
        # DRF's stubs type the rates as numbers; they are "N/period" strings, as parse_rate expects.
        rates = cast("dict[str, str | None]", api_settings.DEFAULT_THROTTLE_RATES)
        return rates.get(self.scope)

    def allow_request(self, request: Request, view: APIView) -> bool:
        try:
            return super().allow_request(request, view)
        except Exception:
            logger.warning("Throttle cache unavailable; request let through", exc_info=True)
            return True

    def cache_key(self, ident: Any) -> str:
        return self.cache_format % {"scope": self.scope, "ident": ident}


class PersonRateThrottle(_SharedCacheThrottle):
    """A logged-in person, by account: session and personal tokens share one budget."""

    scope = "user"

    def get_cache_key(self, request: Request, view: APIView) -> str | None:
        user = request.user
        if _is_controller(user) or _is_ingest(user) or not (user and user.is_authenticated):
            return None
        pk = getattr(user, "pk", None)
        return None if pk is None else self.cache_key(pk)


class ControllerRateThrottle(_SharedCacheThrottle):
    """A scheduler-side controller, by its token."""

    scope = "controller"

    def get_cache_key(self, request: Request, view: APIView) -> str | None:
        user = request.user
        if not _is_controller(user):
            return None
        return self.cache_key(user.token.pk)


class _IngestTokenRateThrottle(_SharedCacheThrottle):
    kind: str

    def get_cache_key(self, request: Request, view: APIView) -> str | None:
        user = request.user
        if not _is_ingest(user) or user.token.kind != self.kind:
            return None
        return self.cache_key(user.token.pk)


class JobTokenRateThrottle(_IngestTokenRateThrottle):
    """A job pushing heartbeats and logs, by its job token."""

    scope = "job_token"
    kind = "job"


class HookTokenRateThrottle(_IngestTokenRateThrottle):
    """A scheduler hook pushing job ends and node failures, by its hook token."""

    scope = "hook_token"
    kind = "hook"
