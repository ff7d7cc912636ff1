"""A task goes through the real Redis broker to a worker process, which changes the database."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from recovery.choices import AuditKind, RecommendationStatus
from recovery.models import AuditEvent
from recovery.read.health import check_redis
from tasks.maintenance import release_expired_leases
from tests.factories import RecommendationFactory

BASE_DIR = Path(settings.BASE_DIR)


def database_url_for_worker() -> str:
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    password = f":{db['PASSWORD']}" if db["PASSWORD"] else ""
    return f"mysql://{db['USER']}{password}@{db['HOST']}:{db['PORT'] or 3306}/{db['NAME']}"


@pytest.fixture
def worker_queue(django_db_reset_sequences: None) -> Iterator[str]:
    if not check_redis().ok:
        pytest.fail(f"Redis does not answer at {settings.REDIS_URL}: run the tests with make test")
    if connection.vendor == "sqlite" and "memory" in str(connection.settings_dict["NAME"]):
        pytest.skip("a worker process cannot share an in-memory SQLite database")
    queue = f"test-{uuid.uuid4().hex[:12]}"
    env = {
        **os.environ,
        "DATABASE_URL": database_url_for_worker(),
        "REDIS_URL": settings.REDIS_URL,
        "WR_CELERY_QUEUE": queue,
    }
    worker = subprocess.Popen(
        [
            sys.executable, "-m", "celery", "-A", "tasks", "worker",
            "--pool", "solo", "--queues", queue, "--hostname", f"{queue}@localhost",
            "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", "INFO",
        ],
        cwd=BASE_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        yield queue
    finally:
        worker.terminate()
        try:
            output, _ = worker.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            output, _ = worker.communicate()
        if worker.returncode not in (0, -15):
            print(output.decode(errors="replace")[-4000:])


def test_a_worker_runs_a_task_sent_through_redis(worker_queue: str) -> None:
    """
    GIVEN a recommendation whose controller's lease ran out, and a worker on a private queue
    WHEN the lease sweep task is sent through the Redis broker
    THEN the worker runs it against the same database and returns its result through Redis
    """
    recommendation = RecommendationFactory(
        status=RecommendationStatus.CLAIMED,
        lease_owner="slurm-advisor-1",
        lease_expires_at=timezone.now() - timedelta(seconds=30),
    )
    result = release_expired_leases.apply_async(queue=worker_queue)
    assert result.get(timeout=60) == 1
    recommendation.refresh_from_db()
    assert recommendation.status == RecommendationStatus.READY
    assert AuditEvent.objects.get(kind=AuditKind.LEASE_EXPIRED).actor == "lease-sweeper"
