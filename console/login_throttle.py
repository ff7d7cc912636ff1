"""Failed sign-ins, counted per account name and per client address.

Counts come from Django's ``user_login_failed`` signal, so every form that authenticates with
the request (the Console's sign-in, the admin's) adds to them. ``lockout`` says whether an
attempt must be refused before its password is checked: once ``LOGIN_FAILURES`` failures for
one account name, or ``LOGIN_ADDRESS_FAILURES`` from one address, fall within a window of
``LOGIN_WINDOW_SECONDS`` that starts at the first of them. A successful sign-in clears its
account's count and no address's: an address that signs in to its own account must not win
more guesses at others.

The counters live in the ``throttle`` cache (Redis, shared by every web process), as the API's
do. A cache that cannot be reached lets sign-ins through with a warning: the throttle protects
the accounts, it must not be the reason nobody can sign in.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import time
import unicodedata
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.core.cache import BaseCache, caches
from django.core.cache.backends.base import InvalidCacheBackendError
from django.dispatch import receiver
from django.http import HttpRequest

logger = logging.getLogger(__name__)

# The cache the API throttles count in (api/resources/throttling.py).
THROTTLE_CACHE = "throttle"
KEY_PREFIX = "login-failures"
# IPv6 clients usually hold a whole /64: count it as one address.
IPV6_PREFIX = 64


@dataclass(frozen=True)
class Lockout:
    """Sign-ins for this account name or from this address are refused until ``until``."""

    until: datetime

    def retry_after_seconds(self, now: float | None = None) -> int:
        remaining = self.until.timestamp() - (time.time() if now is None else now)
        return max(1, int(remaining + 0.999))


def lockout(username: str, address: str, *, now: float | None = None) -> Lockout | None:
    """The lockout that applies to a sign-in for ``username`` from ``address``, if any."""
    now = time.time() if now is None else now
    limits = {
        _account_key(username): settings.LOGIN_FAILURES,
        _address_key(address): settings.LOGIN_ADDRESS_FAILURES,
    }
    try:
        stored = _cache().get_many([*limits, *(_until_key(key) for key in limits)])
    except Exception:
        logger.warning("Login throttle cache unavailable; sign-in let through", exc_info=True)
        return None
    ends = [
        float(stored.get(_until_key(key)) or now + settings.LOGIN_WINDOW_SECONDS)
        for key, limit in limits.items()
        if int(stored.get(key) or 0) >= limit
    ]
    if not ends:
        return None
    return Lockout(until=datetime.fromtimestamp(max(ends), tz=UTC))


def record_failure(username: str, address: str, *, now: float | None = None) -> None:
    """Count one failed sign-in against the account name and the address."""
    now = time.time() if now is None else now
    window = settings.LOGIN_WINDOW_SECONDS
    try:
        cache = _cache()
        for key in (_account_key(username), _address_key(address)):
            # The first failure opens the window; the end is kept to tell people when to retry.
            cache.add(_until_key(key), now + window, timeout=window)
            cache.add(key, 0, timeout=window)
            try:
                cache.incr(key)
            except ValueError:  # the window closed between add and incr
                cache.set(key, 1, timeout=window)
    except Exception:
        logger.warning("Login throttle cache unavailable; failure not counted", exc_info=True)


def forget_account(username: str) -> None:
    """Clear the account name's count after a successful sign-in."""
    key = _account_key(username)
    try:
        _cache().delete_many([key, _until_key(key)])
    except Exception:
        logger.warning("Login throttle cache unavailable; count not cleared", exc_info=True)


def client_address(request: HttpRequest) -> str:
    """The peer's address (never a forwarded header, which any client can write)."""
    return str(request.META.get("REMOTE_ADDR") or "")


def _cache() -> BaseCache:
    try:
        return caches[THROTTLE_CACHE]
    except InvalidCacheBackendError:
        return caches["default"]


def _account_key(username: str) -> str:
    # As the sign-in form reads the name (NFKC, stripped); case folded because MySQL's
    # collation finds the account whatever the case. Hashed: any text fits in a cache key.
    name = unicodedata.normalize("NFKC", username).strip().casefold()
    return f"{KEY_PREFIX}:account:{hashlib.sha256(name.encode()).hexdigest()}"


def _address_key(address: str) -> str:
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return f"{KEY_PREFIX}:address:unknown"
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return f"{KEY_PREFIX}:address:{parsed.ipv4_mapped}"
        network = ipaddress.ip_network(f"{parsed}/{IPV6_PREFIX}", strict=False)
        return f"{KEY_PREFIX}:address:{network}"
    return f"{KEY_PREFIX}:address:{parsed}"


def _until_key(key: str) -> str:
    return f"{key}:until"


@receiver(user_login_failed, dispatch_uid="console.login_throttle.count_failure")
def _count_failure(
    sender: object, credentials: dict[str, Any], request: HttpRequest | None = None, **_: Any
) -> None:
    # Without a request (a test client's login, a shell) there is no address and nobody to stop.
    if request is None:
        return
    username = credentials.get(get_user_model().USERNAME_FIELD)
    record_failure(str(username or ""), client_address(request))


@receiver(user_logged_in, dispatch_uid="console.login_throttle.forget_account")
def _forget_account(sender: object, request: HttpRequest | None, user: Any, **_: Any) -> None:
    if request is None:
        return
    forget_account(user.get_username())
