"""Settings, read from the environment through the typed helpers in ``env``.

Every variable is listed with its default in README.md and deploy/env.example.
"""

from __future__ import annotations

from pathlib import Path

from django.core.exceptions import ImproperlyConfigured
from kombu import Exchange, Queue
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from workload_recovery.env import (
    configured_secret_key,
    env_bool,
    env_int,
    env_list,
    env_str,
    parse_database_url,
    persistent_secret_key,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("WR_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("DEBUG", False)
# Production settings (workload_recovery.production) require SECRET_KEY or SECRET_KEY_FILE and
# read it before this line runs; on a single host without one (the demo, development, tests) a
# key is generated once into the var directory.
SECRET_KEY = configured_secret_key() or persistent_secret_key(VAR_DIR / "secret_key")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "recovery",
    "console",
    "api",
]

MIDDLEWARE = [
    # First, so that nothing reads a body over its limit (workload_recovery/body_limit.py).
    "workload_recovery.body_limit.BodyLimitMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "workload_recovery.urls"
ASGI_APPLICATION = "workload_recovery.asgi.application"
WSGI_APPLICATION = "workload_recovery.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.context_processors.console",
            ],
        },
    },
]

DATABASES = {
    "default": parse_database_url(
        env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'workload_recovery.sqlite3'}"),
        base_dir=BASE_DIR,
    )
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
# Where simulated clusters keep their state: files in this directory, which outlive a Redis
# restart (chaos tests); empty: in Redis. The controller's --simulated reads the same variable,
# so give every process the same absolute path.
SIMULATOR_STATE_DIR = env_str("WR_SIMULATOR_STATE_DIR", "")

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            # redis-py 8 reads with a 5 s socket timeout by default, no longer than the layer's
            # 5 s blocking receive: every idle WebSocket would drop every 5 s. Longer, still finite.
            # A connection left broken by a Redis restart is opened again and the command sent
            # once more, instead of failing a consumer (at worst a Console refresh repeats).
            "hosts": [
                {
                    "address": REDIS_URL,
                    "socket_timeout": 10,
                    "retry_on_error": [RedisConnectionError, RedisTimeoutError],
                }
            ],
            "prefix": env_str("WR_CHANNEL_PREFIX", "wr"),
        },
    }
}

# Celery: every task is acknowledged after it ran, and a task whose worker died is
# delivered again, so tasks must be idempotent (they are: see tasks/).
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = env_str("CELERY_RESULT_BACKEND", REDIS_URL)
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = env_str("WR_CELERY_QUEUE", "recovery")
# A cluster's per-workload work (tasks.polling.process_workloads), split into shards of workload
# ids: a queue of its own, so that a site can give it workers of its own (`celery worker -Q`); a
# worker started without -Q consumes both.
WORKLOAD_QUEUE = env_str("WR_WORKLOAD_QUEUE", f"{CELERY_TASK_DEFAULT_QUEUE}.workloads")
WORKLOAD_SHARDS = env_int("WR_WORKLOAD_SHARDS", 16, minimum=1, maximum=4096)
# Each queue its own exchange and key: a queue named without them takes the default exchange's
# key, and what was sent to it would be delivered to the default queue.
CELERY_TASK_QUEUES = [
    Queue(name, Exchange(name), routing_key=name)
    for name in (CELERY_TASK_DEFAULT_QUEUE, WORKLOAD_QUEUE)
]
CELERY_RESULT_EXPIRES = 3600
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A task whose worker was killed stays unacknowledged until this has passed, then is delivered
# again; a shorter one would deliver a long task again while it still runs. Every task here is
# queued again by beat well before (each expires before its next round), so a killed worker's
# work is redone by the next round, not by this.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
CELERY_TIMEZONE = "UTC"
# Beat keeps its schedule in memory: every entry is a short interval whose task is idempotent, so
# a restarted beat that runs each at once loses nothing. The default shelve file gains nothing,
# and a beat killed while writing it could not start again (found by the chaos run).
CELERY_BEAT_SCHEDULER = "celery.beat:Scheduler"
LEASE_SWEEP_SECONDS = env_int("WR_LEASE_SWEEP_SECONDS", 15, minimum=1)
POLL_SECONDS = env_int("WR_POLL_SECONDS", 5, minimum=1)
# One poll per cluster, and one batch per shard, at a time (tasks/locks.py): renewed while the
# work runs, so a worker killed in the middle of it holds its cluster or shard back for one poll
# period at most, and the round after its death polls it again.
POLL_LOCK_SECONDS = POLL_SECONDS
# How long a queued judge_cluster stays worth running (tasks/polling.py): longer than the shards',
# because queued behind a busy cluster's shards it expired every time at 1,000 jobs (bench-scale).
JUDGE_EXPIRES_SECONDS = max(3 * POLL_SECONDS, 15)
WATCHDOG_SECONDS = env_int("WR_WATCHDOG_SECONDS", 10, minimum=1)
# Job tokens (wrj_) expire: a key copied out of a job stops working on its own.
JOB_TOKEN_MAX_TTL_HOURS = 24 * 30
JOB_TOKEN_TTL_HOURS = env_int(
    "WR_JOB_TOKEN_TTL_HOURS", 72, minimum=1, maximum=JOB_TOKEN_MAX_TTL_HOURS
)
# What job tokens may push for one job (recovery.loop.push_budget.PushBudget). Pushed batches with a
# sequence keep a row per stream and job, whichever token opened it; the documented stream is
# one per node and rank, so 1024 covers every rank of a 1,024-GPU job, or every node of a
# 128-node job over 8 restarts.
JOB_TOKEN_STREAMS_PER_JOB = env_int("WR_JOB_TOKEN_STREAMS_PER_JOB", 1024, minimum=1)
# Per job token and job. Each heartbeat is a stored progress sample, kept two hours: 6000 a
# minute is a heartbeat every ten seconds from each rank of a 1,000-GPU job, or every step from
# one rank at 100 steps/s.
JOB_TOKEN_HEARTBEATS_PER_MINUTE = env_int("WR_JOB_TOKEN_HEARTBEATS_PER_MINUTE", 6000, minimum=1)
# Per job token and job. Each pushed line is scanned by every signature: 30000 a minute is a
# line every two seconds from each rank of a 1,000-GPU job. Its output file is read all the
# same.
JOB_TOKEN_LOG_LINES_PER_MINUTE = env_int("WR_JOB_TOKEN_LOG_LINES_PER_MINUTE", 30000, minimum=1)
# /metrics: open when both are empty; else a bearer token, or a scrape from one of the networks.
# Production settings refuse to start with it open unless METRICS_PUBLIC says that is meant.
METRICS_TOKEN = env_str("WR_METRICS_TOKEN", "")
METRICS_ALLOWED_NETWORKS = env_list("WR_METRICS_NETWORKS", [])
METRICS_PUBLIC = env_bool("WR_METRICS_PUBLIC", False)
INSIGHTS_SECONDS = env_int("WR_INSIGHTS_SECONDS", 300, minimum=10)
# Largest request bodies (workload_recovery/body_limit.py), refused with 413 before they are
# read. Under /api/: twice the largest body an endpoint accepts (1 MiB: a log batch,
# recovery/loop/push.py MAX_LOG_BYTES, or a heartbeat batch), so those endpoints still answer
# with their own limit; never below 1 MiB, which would refuse batches clients are allowed to send.
API_MAX_BODY_BYTES = env_int("WR_API_MAX_BODY_BYTES", 2 * 1024 * 1024, minimum=1024 * 1024)
# The admin's forms: the largest is a workload with its attempts' node lists.
ADMIN_MAX_BODY_BYTES = env_int("WR_ADMIN_MAX_BODY_BYTES", 1024 * 1024, minimum=64 * 1024)
# The sign-in forms (Console and admin), open to anyone: a name, a password, a CSRF token and
# the page to return to.
LOGIN_MAX_BODY_BYTES = env_int("WR_LOGIN_MAX_BODY_BYTES", 16 * 1024, minimum=4 * 1024)
# Every other path: the Console's forms (a decision's note, a cluster's signal stores), /metrics
# and addresses that do not exist.
MAX_BODY_BYTES = env_int("WR_MAX_BODY_BYTES", 64 * 1024, minimum=16 * 1024)
# The longest prefix a path starts with gives its limit; the rest have MAX_BODY_BYTES.
BODY_LIMITS_BY_PREFIX = {
    "/api/": API_MAX_BODY_BYTES,
    "/admin/": ADMIN_MAX_BODY_BYTES,
    "/admin/login/": LOGIN_MAX_BODY_BYTES,
    "/accounts/login/": LOGIN_MAX_BODY_BYTES,
}
CELERY_BEAT_SCHEDULE = {
    "poll-clusters": {
        "task": "tasks.polling.poll_all_clusters",
        "schedule": float(POLL_SECONDS),
        "options": {"expires": POLL_SECONDS * 0.9},
    },
    "release-expired-leases": {
        "task": "tasks.maintenance.release_expired_leases",
        "schedule": float(LEASE_SWEEP_SECONDS),
        # A sweep that waited longer than its period is useless: the next one is due.
        "options": {"expires": LEASE_SWEEP_SECONDS * 0.9},
    },
    "watchdog": {
        "task": "tasks.maintenance.run_watchdog",
        "schedule": float(WATCHDOG_SECONDS),
        "options": {"expires": WATCHDOG_SECONDS * 0.9},
    },
    # Goodput snapshots for the Insights page (they read the audit trail, so not too often).
    "goodput-snapshots": {
        "task": "tasks.maintenance.take_goodput_snapshots",
        "schedule": float(INSIGHTS_SECONDS),
        "options": {"expires": INSIGHTS_SECONDS * 0.9},
    },
}

# An external attribution provider (docs/attribution-provider.md). Empty: built-in rules only,
# and the Console says attribution runs degraded. The call is made once the read that found the
# anomaly is committed, by the worker that made the read, so its timeout is short; it is given
# in milliseconds because the env helpers read integers.
ATTRIBUTION_PROVIDER_URL = env_str("WR_ATTRIBUTION_URL", "")
ATTRIBUTION_PROVIDER_TIMEOUT = env_int("WR_ATTRIBUTION_TIMEOUT_MS", 2000, minimum=50) / 1000
ATTRIBUTION_PROVIDER_TOKEN = env_str("WR_ATTRIBUTION_TOKEN", "")
# At most this many provider calls follow one read (and one poll's catch-up); the anomalies
# past it keep their built-in verdict, and their ATTRIBUTED event says why.
MAX_PROVIDER_CALLS_PER_READ = env_int("WR_MAX_PROVIDER_CALLS_PER_READ", 3, minimum=0)

# The labelled real logs (JSON lines, read recursively: ``id``, ``category``, ``attribution``,
# ``source``, ``log``) a pattern taught in the Console is previewed on before it is saved: the
# verdicts it changes, and no healthy log made a failure. The repository's own corpus unless set.
LABELLED_CASES_DIR = Path(
    env_str("WR_LABELLED_CASES_DIR", str(BASE_DIR / "tests" / "detection" / "data"))
)

# Work per job is bounded: one read of a job's output (or a node's kernel log) adds at most
# WR_MAX_NEW_ANOMALIES_PER_READ anomalies, and an attempt has at most
# WR_MAX_ANOMALIES_PER_ATTEMPT. Findings past either cap are folded into an existing anomaly of
# the same attempt (its count and last-seen time grow) and the trail says so once per attempt.
MAX_NEW_ANOMALIES_PER_READ = env_int("WR_MAX_NEW_ANOMALIES_PER_READ", 10, minimum=1)
MAX_ANOMALIES_PER_ATTEMPT = env_int("WR_MAX_ANOMALIES_PER_ATTEMPT", 50, minimum=1)

# The configurator (Console and ``configure_signals``) connects only to these hosts: exact host
# names or addresses, compared with the URL's host. Empty: it connects to none.
CONFIGURATOR_ALLOWED_HOSTS = env_list("WR_CONFIGURATOR_ALLOWED_HOSTS", [])

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "console:fleet"
LOGOUT_REDIRECT_URL = "login"
# Failed sign-ins (Console and admin) are counted in the throttle cache, per account name and
# per client address. Past either limit within the window, sign-ins for that account or from
# that address are refused, without checking the password, until the window ends. The address
# limit is higher: many people may share one address (a NAT, an office proxy).
LOGIN_FAILURES = env_int("WR_LOGIN_FAILURES", 5, minimum=1)
LOGIN_ADDRESS_FAILURES = env_int("WR_LOGIN_ADDRESS_FAILURES", 20, minimum=1)
LOGIN_WINDOW_SECONDS = env_int("WR_LOGIN_WINDOW_SECONDS", 900, minimum=1)

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    "workload_recovery.staticfinders.PackageAssetFinder",
]
# collectstatic's output, which the pages' manifest names: built into an image, it must not move
# with WR_VAR_DIR (a volume there would hide it and every page would answer 500).
STATIC_ROOT = Path(env_str("WR_STATIC_ROOT", str(VAR_DIR / "staticfiles")))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}
# Serve straight from the app folders in development, so no collectstatic is needed there.
WHITENOISE_USE_FINDERS = DEBUG
WHITENOISE_AUTOREFRESH = DEBUG


def _api_rate(name: str, default: str) -> str:
    """A DRF rate such as ``600/minute``; anything else fails at start-up, not per request."""
    value = env_str(name, default) or default
    number, _, period = value.partition("/")
    if not number.isdigit() or int(number) < 1 or period not in _RATE_PERIODS:
        raise ImproperlyConfigured(
            f"{name}={value!r} is not a rate (use e.g. 600/minute; periods: second, minute, "
            "hour, day)"
        )
    return value


_RATE_PERIODS = {"s", "sec", "second", "m", "min", "minute", "h", "hour", "d", "day"}

# Throttle counters must be shared by every web process, so they live in Redis. The default
# cache stays per process (local memory): other code relies on that, and its tests clear it.
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "throttle": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": env_str("WR_THROTTLE_REDIS_URL", REDIS_URL),
        "KEY_PREFIX": env_str("WR_THROTTLE_KEY_PREFIX", "wr-throttle"),
        # A Redis that does not answer must not hold up requests; throttles then let them pass.
        "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
    },
}

REST_FRAMEWORK = {
    # Session first: a caller with neither a session nor a token gets 403 here, as before; the
    # resources under /api/v1/ put the token first, so they answer 401 with WWW-Authenticate.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "api.tokens.PersonalTokenAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # DRF's defaults, with JSON nested too deeply to read answered 400 instead of 500.
    "DEFAULT_PARSER_CLASSES": [
        "api.parsers.BoundedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_THROTTLE_CLASSES": [
        "api.resources.throttling.PersonRateThrottle",
        "api.resources.throttling.ControllerRateThrottle",
        "api.resources.throttling.JobTokenRateThrottle",
        "api.resources.throttling.HookTokenRateThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {
        "user": _api_rate("WR_API_RATE", "600/minute"),
        "controller": _api_rate("WR_API_CONTROLLER_RATE", "600/minute"),
        "job_token": _api_rate("WR_API_JOB_TOKEN_RATE", "600/minute"),
        "hook_token": _api_rate("WR_API_HOOK_TOKEN_RATE", "600/minute"),
    },
    "EXCEPTION_HANDLER": "api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Workload Recovery API",
    "DESCRIPTION": (
        "The Advisor API for scheduler-side controllers (Bearer controller token `wrc_…`, "
        "scoped to one cluster) and the REST API for integrations (a person's Bearer token "
        "`wrp_…` or a Console session, with that person's Console role). Lists are cursor "
        "pages, newest first: follow `next` and `previous`. Every error is JSON: "
        '`{"error": "<message>", "code": "<code>", "detail": "<message>"}`, plus `fields` '
        "on a 400 and `retry_after` on a 429 (also the Retry-After header)."
    ),
    "TAGS": [
        {"name": "clusters", "description": "Clusters and their goodput."},
        {"name": "nodes", "description": "Nodes, with suspect and exclusion flags."},
        {"name": "workloads", "description": "Workloads, their attempts and goodput."},
        {"name": "anomalies", "description": "Anomalies and the verdicts attributing them."},
        {"name": "recommendations", "description": "Recommendations; operators decide."},
        {"name": "audit", "description": "The append-only audit trail."},
        {"name": "goodput", "description": "Goodput figures from the audit trail."},
        {"name": "advisor", "description": "For scheduler-side controllers only."},
    ],
    # Two models call different choices "kind": give each enum its own name.
    "ENUM_NAME_OVERRIDES": {
        "AnomalyKindEnum": "recovery.choices.AnomalyKind",
        "AuditKindEnum": "recovery.choices.AuditKind",
    },
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # Assets come from the installed sidecar package: the docs page works without internet.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
}

# HTTPS-only cookies, HSTS and the HTTP-to-HTTPS redirect are switched on by
# ``workload_recovery.production``; here they stay off so a local demo works over plain HTTP.
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", False)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
if env_bool("SECURE_PROXY_SSL_HEADER", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "filters": {
        "one_line_client_errors": {"()": "workload_recovery.log_filters.OneLineClientErrors"}
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "filters": ["one_line_client_errors"],
        }
    },
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        # Django's own default handler would print every django.* record a second time under
        # DEBUG: its records go to the root handler only.
        "django": {"handlers": [], "level": env_str("LOG_LEVEL", "INFO"), "propagate": True},
        "django.channels.server": {"level": "WARNING"},
        # httpx logs every request's URL at INFO, credentials in it included.
        "httpx": {"level": "WARNING"},
    },
}

if (BASE_DIR / "workload_recovery" / "local_settings.py").exists():
    from workload_recovery.local_settings import *  # noqa: F403
