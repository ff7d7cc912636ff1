"""The poll's lock: kept while a poll runs, lapsing soon after its worker is killed (real Redis)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
import redis
from django.conf import settings

from tasks.locks import held_while_running

pytestmark = pytest.mark.services


@pytest.fixture
def client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


def test_a_running_holder_keeps_the_lock_past_its_timeout(client: redis.Redis) -> None:
    key = f"test:lock:{uuid.uuid4().hex}"
    with held_while_running(client, key, timeout_s=0.6) as ours:
        assert ours
        time.sleep(1.5)  # two and a half timeouts: renewed meanwhile
        assert client.exists(key)
        with held_while_running(client, key, timeout_s=0.6) as second:
            assert not second
    assert not client.exists(key)


def test_a_killed_holder_frees_the_cluster_within_one_timeout(client: redis.Redis) -> None:
    """The worker killed in the middle of a poll: before, its cluster went unpolled for
    sixty poll periods (the old lock's fixed timeout)."""
    key = f"test:lock:{uuid.uuid4().hex}"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import time, redis
                from tasks.locks import held_while_running
                client = redis.Redis.from_url({settings.REDIS_URL!r})
                with held_while_running(client, {key!r}, timeout_s=1.0) as ours:
                    print("held" if ours else "busy", flush=True)
                    time.sleep(60)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        cwd=settings.BASE_DIR,
        env={**os.environ},
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == b"held"
        time.sleep(1.5)
        assert client.exists(key), "the live holder renews its lock"
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        killed_at = time.monotonic()
        while client.exists(key):
            assert time.monotonic() - killed_at < 2.0, "the dead holder's lock did not lapse"
            time.sleep(0.05)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_a_lock_lost_with_redis_does_not_fail_the_holder(client: redis.Redis) -> None:
    """Redis restarted empty during a poll: the poll finishes and releases nothing."""
    key = f"test:lock:{uuid.uuid4().hex}"
    with held_while_running(client, key, timeout_s=0.6) as ours:
        assert ours
        client.delete(key)
        time.sleep(0.5)
    assert not client.exists(key)
