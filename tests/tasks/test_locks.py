"""The poll and shard locks with the timeout the workers use: a killed worker's cluster is free
again within one poll period, a live worker keeps it however long it runs (real Redis, a real
process SIGKILLed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from django.conf import settings

from tasks.locks import held_while_running

pytestmark = pytest.mark.services


@pytest.fixture
def client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


@pytest.fixture
def holder(client: redis.Redis) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A process holding a fresh lock with the workers' timeout, as a poll does, until killed."""
    key = f"test:lock:{uuid.uuid4().hex}"
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import time, redis
                from tasks.locks import held_while_running
                client = redis.Redis.from_url({settings.REDIS_URL!r})
                with held_while_running(
                    client, {key!r}, timeout_s={settings.POLL_LOCK_SECONDS!r}
                ) as ours:
                    print("held" if ours else "busy", flush=True)
                    time.sleep(600)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        cwd=settings.BASE_DIR,
        env={**os.environ},
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == b"held"
        yield process, key
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_the_workers_lock_lapses_within_one_poll_period(client: redis.Redis) -> None:
    assert settings.POLL_LOCK_SECONDS <= settings.POLL_SECONDS
    key = f"test:lock:{uuid.uuid4().hex}"
    with held_while_running(client, key, timeout_s=settings.POLL_LOCK_SECONDS) as ours:
        assert ours
        assert 0 < client.pttl(key) <= settings.POLL_SECONDS * 1000


def test_a_killed_holder_frees_the_lock_within_one_poll_period_a_live_one_keeps_it(
    client: redis.Redis, holder: tuple[subprocess.Popen[bytes], str]
) -> None:
    """
    GIVEN a worker process holding a poll's lock with the workers' timeout
    WHEN it runs for two timeouts, then is SIGKILLed
    THEN nobody else can take the lock while it runs, and the lock lapses within one poll
         period of its death, so the next round polls the cluster again
    """
    process, key = holder
    deadline = time.monotonic() + 2 * settings.POLL_LOCK_SECONDS
    while time.monotonic() < deadline:
        with held_while_running(client, key, timeout_s=settings.POLL_LOCK_SECONDS) as second:
            assert not second, "a live holder lost its lock"
        time.sleep(0.2)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    killed_at = time.monotonic()
    while client.exists(key):
        # The check's own step is the only slack.
        assert time.monotonic() - killed_at < settings.POLL_SECONDS + 0.1, "still held"
        time.sleep(0.02)
    with held_while_running(client, key, timeout_s=settings.POLL_LOCK_SECONDS) as next_round:
        assert next_round
