"""Settings for a deployment behind TLS: ``DJANGO_SETTINGS_MODULE=workload_recovery.production``.

Everything from ``settings`` applies; the HTTPS protections default to on and each can still be
set through its environment variable. ``manage.py check --deploy`` passes with these defaults.

Loading these settings fails, so no process (web, worker, beat, ``manage.py``) starts, unless:

- ``SECRET_KEY`` or ``SECRET_KEY_FILE`` gives the signing key, the same for every process on
  every host (a key file must be its owner's alone). The base settings would otherwise generate
  one per host, and sessions and CSRF tokens signed by one web replica would fail on the next;
  so the key is read before the base settings load, and nothing is written.
- ``/metrics`` is not open to anyone who can reach the server: a scrape token or networks, or
  ``WR_METRICS_PUBLIC=true`` to say it is meant to be open.

A system check would not do: uvicorn runs none.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from workload_recovery.env import env_bool, env_int, required_secret_key

signing_key = required_secret_key()

from workload_recovery.settings import *  # noqa: E402, F403
from workload_recovery.settings import (  # noqa: E402
    METRICS_ALLOWED_NETWORKS,
    METRICS_PUBLIC,
    METRICS_TOKEN,
)

SECRET_KEY = signing_key

if not (METRICS_TOKEN or METRICS_ALLOWED_NETWORKS or METRICS_PUBLIC):
    raise ImproperlyConfigured(
        "/metrics would be open to anyone: set WR_METRICS_TOKEN (the bearer token Prometheus "
        "sends) or WR_METRICS_NETWORKS (the networks that may scrape), or set "
        "WR_METRICS_PUBLIC=true if it is meant to be open"
    )

DEBUG = env_bool("DEBUG", False)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", True)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", True)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", True)
