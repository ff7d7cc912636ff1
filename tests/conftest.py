from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.core.management.color import Style
from django.db.backends.base.operations import BaseDatabaseOperations
from django.db.backends.mysql.operations import DatabaseOperations as MySQLOperations
from pytest_django.fixtures import Settings as SettingsWrapper

from recovery.models import AuditEvent
from recovery.roles import ADMIN, OPERATOR, VIEWER, sync_roles
from tests.parallel import (
    GroupScheduling,
    check_groups,
    check_ids_unique,
    use_own_redis_database,
)

# The Slurm cluster fixtures, shared by tests/slurm and tests/e2e (one cluster per session), and the
# controller's own wheel in fresh environments (tests/deploy, tests/slurm).
pytest_plugins = ["pytester", "tests.slurm_fixtures", "tests.controller_package_fixtures"]

TEST_PASSWORD = "correct horse battery staple 42"


def pytest_configure(config: pytest.Config) -> None:
    from django.conf import settings

    use_own_redis_database(settings, os.environ)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    check_groups(items)
    check_ids_unique(items)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> GroupScheduling:
    return GroupScheduling(config, log)


@pytest.fixture(autouse=True)
def _static_files_without_manifest(settings: SettingsWrapper) -> None:
    # Tests render templates and serve assets without running collectstatic first.
    settings.WHITENOISE_USE_FINDERS = True
    settings.WHITENOISE_AUTOREFRESH = True
    settings.STORAGES = {
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }


@pytest.fixture(autouse=True)
def _own_throttle_counters(settings: SettingsWrapper) -> None:
    # Throttle counters (the API's, failed sign-ins) live in Redis and outlast a test run: a
    # prefix per test keeps a wrong password in one test from locking out a user in another.
    settings.CACHES = {
        **settings.CACHES,
        "throttle": {**settings.CACHES["throttle"], "KEY_PREFIX": f"test-{uuid.uuid4().hex}"},
    }


@pytest.fixture(scope="session", autouse=True)
def _static_root_exists() -> None:
    # The live server's WhiteNoise is built before per-test settings apply; give it its folder.
    from django.conf import settings

    Path(settings.STATIC_ROOT).mkdir(parents=True, exist_ok=True)


@pytest.fixture(scope="session", autouse=True)
def _flush_audit_trail_with_truncate() -> Iterator[None]:
    """Let transactional tests empty the audit table on MySQL.

    Django's test flush uses DELETE, which the append-only trigger refuses; TRUNCATE does not
    fire row triggers. Only the tests' flush is changed: ``manage.py flush`` stays refused.
    """
    original = MySQLOperations.sql_flush
    table = AuditEvent._meta.db_table

    def sql_flush(
        self: BaseDatabaseOperations,
        style: Style,
        tables: Sequence[str],
        *,
        reset_sequences: bool = False,
        allow_cascade: bool = False,
    ) -> list[str]:
        statements = original(
            self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
        )
        return [
            f"TRUNCATE {self.quote_name(table)};"
            if statement.startswith("DELETE") and table in statement
            else statement
            for statement in statements
        ]

    MySQLOperations.sql_flush = sql_flush  # type: ignore[method-assign]
    yield
    MySQLOperations.sql_flush = original  # type: ignore[method-assign]


@pytest.fixture
def make_user(db: None) -> Callable[..., User]:
    def make(username: str, role: str | None = None, **extra: Any) -> User:
        user = User.objects.create_user(username=username, password=TEST_PASSWORD, **extra)
        if role is not None:
            if not Group.objects.filter(name=role).exists():
                # A transactional test before this one flushed the groups the migration made.
                sync_roles(Group, Permission)
            user.groups.add(Group.objects.get(name=role))
        return user

    return make


@pytest.fixture
def viewer(make_user: Callable[..., User]) -> User:
    return make_user("vera", VIEWER)


@pytest.fixture
def operator(make_user: Callable[..., User]) -> User:
    return make_user("otto", OPERATOR)


@pytest.fixture
def site_admin(make_user: Callable[..., User]) -> User:
    return make_user("ada", ADMIN, is_staff=True)


@pytest.fixture
def outsider(make_user: Callable[..., User]) -> User:
    """Logged in, but in no Console role."""
    return make_user("oscar")
