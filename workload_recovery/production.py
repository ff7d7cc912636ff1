"""Settings for a deployment behind TLS: ``DJANGO_SETTINGS_MODULE=workload_recovery.production``.

Everything from ``settings`` applies; the HTTPS protections default to on and each can still be
set through its environment variable. ``manage.py check --deploy`` passes with these defaults.
"""

from __future__ import annotations

from workload_recovery.env import env_bool, env_int
from workload_recovery.settings import *  # noqa: F403

DEBUG = env_bool("DEBUG", False)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", True)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", True)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", True)
