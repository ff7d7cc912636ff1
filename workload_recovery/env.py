"""Typed readers for environment variables.

Every setting the project reads from the environment goes through these helpers, so a
malformed value fails loudly at start-up instead of surfacing later as odd behaviour.
A variable ``NAME_FILE`` may hold the path of a file whose content is the value, which is
how container secrets are usually mounted.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import NotRequired, TypedDict, overload
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@overload
def env_str(name: str, default: str) -> str: ...


@overload
def env_str(name: str, default: None = None) -> str | None: ...


def env_str(name: str, default: str | None = None) -> str | None:
    """Return the variable, or the content of the file named by ``NAME_FILE``, or ``default``."""
    file_name = os.environ.get(f"{name}_FILE")
    if file_name:
        try:
            return Path(file_name).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE={file_name!r} cannot be read: {exc}") from exc
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value


def env_bool(name: str, default: bool) -> bool:
    value = env_str(name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={value!r} is not a boolean (use true or false)")


def env_int(
    name: str, default: int, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    value = env_str(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not an integer") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}={number} is below the minimum of {minimum}")
    if maximum is not None and number > maximum:
        raise ImproperlyConfigured(f"{name}={number} is above the maximum of {maximum}")
    return number


def env_list(name: str, default: list[str]) -> list[str]:
    value = env_str(name)
    if value is None:
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]


def persistent_secret_key(path: Path) -> str:
    """Return the secret key stored at ``path``, generating and storing one when absent.

    The key is created with owner-only permissions so another local user cannot read it.
    """
    try:
        key = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        key = ""
    if key:
        return key
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(64)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(key)
    return key


_ENGINES = {
    "sqlite": "django.db.backends.sqlite3",
    "mysql": "django.db.backends.mysql",
    "mariadb": "django.db.backends.mysql",
}


class DatabaseSettings(TypedDict):
    """One entry of ``DATABASES``: what ``parse_database_url`` fills in."""

    ENGINE: str
    NAME: str
    OPTIONS: dict[str, object]
    USER: NotRequired[str]
    PASSWORD: NotRequired[str]
    HOST: NotRequired[str]
    PORT: NotRequired[str]
    CONN_MAX_AGE: NotRequired[int]
    CONN_HEALTH_CHECKS: NotRequired[bool]
    TEST: NotRequired[dict[str, str]]


def parse_database_url(url: str, *, base_dir: Path) -> DatabaseSettings:
    """Turn ``sqlite:///path`` or ``mysql://user:pass@host:port/name?opt=v`` into a DATABASES entry.

    A relative SQLite path is resolved against ``base_dir``.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _ENGINES:
        supported = ", ".join(sorted(_ENGINES))
        raise ImproperlyConfigured(
            f"DATABASE_URL scheme {scheme!r} is not supported (use one of: {supported})"
        )
    if scheme == "sqlite":
        raw_path = unquote(parts.path)
        # sqlite:///relative/file and sqlite:////absolute/file, as in SQLAlchemy.
        path = raw_path[1:] if raw_path.startswith("/") else raw_path
        if not path:
            raise ImproperlyConfigured("DATABASE_URL for sqlite names no file")
        file_path = Path(path)
        if not file_path.is_absolute():
            file_path = base_dir / file_path
        return {
            "ENGINE": _ENGINES[scheme],
            "NAME": str(file_path),
            # Web, worker and beat share the file: wait for locks instead of failing, and let
            # readers proceed while one process writes.
            "OPTIONS": {
                "timeout": 30,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }

    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise ImproperlyConfigured("DATABASE_URL names no database (mysql://user@host/NAME)")
    try:
        port = parts.port
    except ValueError:
        raise ImproperlyConfigured("DATABASE_URL has an invalid port") from None
    options: dict[str, object] = {"charset": "utf8mb4"}
    options.update(dict(parse_qsl(parts.query)))
    return {
        "ENGINE": _ENGINES[scheme],
        "NAME": name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(port or ""),
        "OPTIONS": options,
        "CONN_MAX_AGE": 60,
        "CONN_HEALTH_CHECKS": True,
        "TEST": {"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_unicode_ci"},
    }
