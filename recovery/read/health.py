"""Reachability of the services the control plane depends on."""

from __future__ import annotations

from dataclasses import dataclass

import redis
from django.conf import settings
from django.db import DatabaseError, connection


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    ok: bool
    detail: str


def check_database() -> ServiceStatus:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError as exc:
        return ServiceStatus("database", False, str(exc)[:200])
    return ServiceStatus("database", True, connection.vendor)


def check_redis(timeout_seconds: float = 1.0) -> ServiceStatus:
    client = redis.Redis.from_url(
        settings.REDIS_URL,
        socket_connect_timeout=timeout_seconds,
        socket_timeout=timeout_seconds,
    )
    try:
        client.ping()
    except redis.RedisError as exc:
        return ServiceStatus("redis", False, str(exc)[:200])
    finally:
        client.close()
    return ServiceStatus("redis", True, "ping answered")


def service_statuses() -> list[ServiceStatus]:
    return [check_database(), check_redis()]
