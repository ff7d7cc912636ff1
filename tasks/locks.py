"""A Redis lock held for as long as its holder runs, and not a moment longer once it is killed.

A poll may take a second or, on a very large cluster, minutes. A lock whose timeout covers the
slowest poll keeps a cluster unpolled for that long after a worker is killed in the middle of
one; a short timeout alone lets a second poll start beside a slow first one. So the timeout is
short (one poll period, ``settings.POLL_LOCK_SECONDS``) and a thread of the holder renews it
while the work runs: a killed holder's lock lapses within one timeout, in time for the next
round, and a slow live one keeps it.

The thread renews four times per timeout, so that a renewal that comes late (a busy worker
host, a slow answer from Redis) still finds the lock there; a holder whose renewals all fail
for most of a timeout has lost it, as one killed has.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

import redis

logger = logging.getLogger(__name__)

RENEWALS_PER_TIMEOUT = 4


@contextlib.contextmanager
def held_while_running(client: redis.Redis, key: str, *, timeout_s: float) -> Iterator[bool]:
    """Yield whether the lock was free and is now ours; renewed while the body runs, so that it
    lapses within ``timeout_s`` of its holder's death and not while the holder lives."""
    # Not thread-local: the keeper thread renews the token the holder's thread acquired.
    lock = client.lock(key, timeout=timeout_s, blocking_timeout=0, thread_local=False)
    if not lock.acquire():
        yield False
        return
    done = threading.Event()

    def keep() -> None:
        while not done.wait(timeout_s / RENEWALS_PER_TIMEOUT):
            try:
                lock.reacquire()
            except redis.exceptions.LockError:
                # Gone (Redis restarted empty) or taken: nothing left to renew.
                logger.warning("lock %s was lost while its holder still ran", key)
                return
            except redis.RedisError as exc:
                logger.warning("could not renew lock %s: %s", key, exc)

    keeper = threading.Thread(target=keep, name=f"keep {key}", daemon=True)
    keeper.start()
    try:
        yield True
    finally:
        done.set()
        keeper.join()
        # Lapsed during a very slow poll or lost with a Redis restart: nothing to release.
        with contextlib.suppress(redis.exceptions.LockError, redis.RedisError):
            lock.release()
