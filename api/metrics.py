"""``/metrics``: the system's own figures in Prometheus' text format.

Prometheus scrapes without a session. With neither ``METRICS_TOKEN`` nor
``METRICS_ALLOWED_NETWORKS`` set the endpoint is open (``workload_recovery.production`` refuses
to start so unless ``METRICS_PUBLIC`` is set); otherwise a scrape needs the token as a bearer
token or must come from one of the networks (the peer address, never a forwarded header, which
any client can write).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse

from recovery.read import self_metrics as figures

logger = logging.getLogger(__name__)

ALLOWED_METHODS = ("GET", "HEAD")


def metrics(request: HttpRequest) -> HttpResponse:
    if request.method not in ALLOWED_METHODS:
        response = _text(f"{request.method} is not allowed here: use GET.\n", status=405)
        response["Allow"] = ", ".join(ALLOWED_METHODS)
        return response
    if not _may_scrape(request):
        response = _text("A valid bearer token is required to read the metrics.\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    if request.method == "HEAD":
        return _text("")
    try:
        body = figures.exposition()
    except DatabaseError:
        logger.exception("metrics could not be read from the database")
        return _text("The metrics are unavailable: the database did not answer.\n", status=503)
    return HttpResponse(body, content_type=figures.CONTENT_TYPE)


def _text(message: str, status: int = 200) -> HttpResponse:
    return HttpResponse(message, status=status, content_type=figures.CONTENT_TYPE)


def _may_scrape(request: HttpRequest) -> bool:
    token: str = getattr(settings, "METRICS_TOKEN", "") or ""
    networks: list[str] = list(getattr(settings, "METRICS_ALLOWED_NETWORKS", []) or [])
    if not token and not networks:
        return True
    presented = _bearer_token(request)
    if token and presented is not None:
        # Bytes: compare_digest refuses str with non-ASCII characters, which a client may send.
        return hmac.compare_digest(presented.encode(), token.encode())
    return _from_networks(request.META.get("REMOTE_ADDR", ""), networks)


def _bearer_token(request: HttpRequest) -> str | None:
    scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        return None
    return credentials.strip()


def _from_networks(address: str, networks: list[str]) -> bool:
    try:
        peer = ipaddress.ip_address(address)
    except ValueError:
        return False
    for network in networks:
        try:
            if peer in ipaddress.ip_network(network, strict=False):
                return True
        except ValueError:
            logger.warning("METRICS_ALLOWED_NETWORKS: %r is not a network, ignored", network)
    return False
