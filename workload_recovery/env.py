"""Typed readers for environment variables.

Every setting the project reads from the environment goes through these helpers, so a
malformed value fails loudly at start-up instead of surfacing later as odd behaviour.
A variable ``NAME_FILE`` may hold the path of a file whose content is the value, which is
how container secrets are usually mounted.
"""

from __future__ import annotations

import os
import secrets
import stat
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


def private_file_text(path: Path, described_as: str) -> str:
    """The content of a file only its owner may read or write, whitespace stripped.

    A key that others on the host can read is no longer a secret, and one they can write lets
    them choose it: either stops start-up. The mode is checked on the file that was opened, so
    it cannot be swapped between the check and the read.
    """
    # Non-blocking: a FIFO in its place fails the check below instead of hanging start-up.
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(descriptor, encoding="utf-8") as handle:
        status = os.fstat(handle.fileno())
        if not stat.S_ISREG(status.st_mode):
            raise ImproperlyConfigured(f"{described_as} is not a regular file")
        mode = stat.S_IMODE(status.st_mode)
        if mode & 0o077:
            raise ImproperlyConfigured(
                f"{described_as} may be read or written by others (mode {mode:04o}): make it "
                f"its owner's alone, e.g. chmod 600 {str(path)!r}, owned by the user the "
                "service runs as"
            )
        return handle.read().strip()


def configured_secret_key() -> str | None:
    """``SECRET_KEY``, or the content of the file ``SECRET_KEY_FILE`` names, or None.

    Unlike other ``_FILE`` settings, the key file must be its owner's alone (mode 0600 or 0400).
    """
    file_name = os.environ.get("SECRET_KEY_FILE")
    if file_name:
        try:
            key = private_file_text(Path(file_name), f"SECRET_KEY_FILE={file_name!r}")
        except OSError as exc:
            raise ImproperlyConfigured(
                f"SECRET_KEY_FILE={file_name!r} cannot be read: {exc}"
            ) from exc
        if not key:
            raise ImproperlyConfigured(f"SECRET_KEY_FILE={file_name!r} is empty")
        return key
    return os.environ.get("SECRET_KEY") or None


def required_secret_key() -> str:
    """The configured key; without one, start-up stops.

    For production: a key generated on each host would differ between hosts, and a session or
    CSRF token signed by one web replica would be refused by the next.
    """
    key = configured_secret_key()
    if key is None:
        raise ImproperlyConfigured(
            "SECRET_KEY is not set: production settings do not generate one, because every "
            "host would make its own and sessions and CSRF tokens signed on one would fail on "
            "the others. Set SECRET_KEY, or SECRET_KEY_FILE to a file only the service user "
            "can read (mode 0600), with the same value for every process on every host "
            "(e.g. python3 -c 'import secrets; print(secrets.token_urlsafe(64))')"
        )
    return key


def persistent_secret_key(path: Path) -> str:
    """Return the secret key stored at ``path``, generating and storing one when absent.

    For a single host (the demo, development, tests): the key is created with owner-only
    permissions so another local user cannot read it, and an existing file readable by others
    stops start-up.
    """
    try:
        key = private_file_text(path, f"The secret key file {str(path)!r}")
    except FileNotFoundError:
        key = ""
    except OSError as exc:
        raise ImproperlyConfigured(
            f"The secret key file {str(path)!r} cannot be read: {exc}"
        ) from exc
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
