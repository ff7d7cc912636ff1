"""What one job token may push for one job: the caps, counted where every web process sees them.

Kept apart from what is pushed (``push``): the counting lives in Redis, by one script per
change, and knows nothing of heartbeats or log lines but how many there are. ``PushBudget``
holds a job token's pushes to streams of batches per job and to heartbeats and log lines per
minute; a push past a cap is refused whole (``PushRefused``), and one that cannot be counted
(``BudgetUnknown``) is not stored either.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, cast

from django.conf import settings

from recovery.models import LogCursor, Workload

if TYPE_CHECKING:
    import redis

logger = logging.getLogger(__name__)

PUSHED_STREAM_PREFIX = "push:"


class PushRefused(Exception):
    """A push past a cap of its token: nothing of it was stored.

    ``retry_after`` is the seconds until the cap allows it again, or None when it never will
    as sent (more in one request than the cap allows in a minute).
    """

    def __init__(self, message: str, retry_after: int | None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class BudgetUnknown(Exception):
    """What the token has pushed this minute cannot be read (Redis does not answer): nothing is
    stored, as a push that is not counted could store without bound."""


class Spent(StrEnum):
    """What a job token's pushes for one job are counted in, per minute."""

    HEARTBEATS = "heartbeats"
    LOG_LINES = "log lines"


# Past the stream cap nothing resets; a client that waits this long before asking again asks
# once a minute.
STREAM_CAP_RETRY_SECONDS = 60
BUDGET_WINDOW_MS = 60_000
BUDGET_UNKNOWN_RETRY_SECONDS = 5
# Adds ``count`` to the minute's counter unless that passes ``limit``; the minute starts with
# the first push counted. Returns {1, total} when added, {0, milliseconds left} when not.
_TAKE = """
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local count = tonumber(ARGV[1])
if used + count > tonumber(ARGV[2]) then
  return {0, redis.call('PTTL', KEYS[1])}
end
used = redis.call('INCRBY', KEYS[1], count)
if used == count then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return {1, used}
"""
# Gives ``count`` back when what it was taken for was not stored after all; a counter whose
# minute has ended is not brought back.
_GIVE_BACK = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.call('DECRBY', KEYS[1], ARGV[1])
end
return 0
"""


@functools.cache
def _budget_redis(url: str) -> redis.Redis:
    import redis

    # A Redis that does not answer must not hold a web process for long: the push is refused.
    return redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)


@dataclass(frozen=True)
class PushBudget:
    """The caps one job token's pushes for one job are held to (settings ``JOB_TOKEN_*``).

    The per-minute counts live in Redis, where the API's request rates are counted, and are
    changed by one script each, so that concurrent requests on any number of web processes
    never pass a cap together. Streams are rows of the job, counted under its row lock.
    """

    token_id: int
    streams_per_job: int
    heartbeats_per_minute: int
    log_lines_per_minute: int

    @classmethod
    def of_token(cls, token_id: int) -> PushBudget:
        return cls(
            token_id=token_id,
            streams_per_job=settings.JOB_TOKEN_STREAMS_PER_JOB,
            heartbeats_per_minute=settings.JOB_TOKEN_HEARTBEATS_PER_MINUTE,
            log_lines_per_minute=settings.JOB_TOKEN_LOG_LINES_PER_MINUTE,
        )

    def limit(self, spent: Spent) -> int:
        if spent == Spent.HEARTBEATS:
            return self.heartbeats_per_minute
        return self.log_lines_per_minute

    def take(self, workload: Workload, spent: Spent, count: int) -> None:
        """Count ``count`` heartbeats or lines for the job, or raise ``PushRefused`` (nothing
        counted) when that would pass the minute's cap; ``BudgetUnknown`` when Redis does not
        answer."""
        if count <= 0:
            return
        limit = self.limit(spent)
        if count > limit:
            raise PushRefused(
                f"Too large: {count} {spent} in one request, and a job token may push at most "
                f"{limit} {spent} per minute for one job; send fewer per request.",
                None,
            )
        try:
            taken, value = self._run(_TAKE, workload, spent, count, limit, BUDGET_WINDOW_MS)
        except Exception as exc:  # a budget that cannot be read refuses the push (fail closed)
            raise BudgetUnknown(str(exc)) from exc
        if taken:
            return
        wait = max(1, math.ceil(value / 1000)) if value > 0 else BUDGET_WINDOW_MS // 1000
        raise PushRefused(
            f"This job token may push at most {limit} {spent} per minute for job "
            f"{workload.job_id}, and these {count} would pass that; none of them was stored. "
            f"Send them again in {wait} s.",
            wait,
        )

    def give_back(self, workload: Workload, spent: Spent, count: int) -> None:
        """Undo ``take`` for what was not stored after all; never raises."""
        if count <= 0:
            return
        try:
            self._run(_GIVE_BACK, workload, spent, count)
        except Exception:  # called while another error unwinds: that one must reach the caller
            logger.warning(
                "could not give back %s %s of job token %s",
                count, spent, self.token_id, exc_info=True,
            )  # fmt: skip

    @contextmanager
    def taken(self, spending: Iterable[tuple[Workload, Spent, int]]) -> Iterator[None]:
        """Take every part of ``spending`` or none, and give all back if the block fails."""
        done: list[tuple[Workload, Spent, int]] = []
        try:
            for workload, spent, count in spending:
                self.take(workload, spent, count)
                done.append((workload, spent, count))
            yield
        except BaseException:
            for workload, spent, count in done:
                self.give_back(workload, spent, count)
            raise

    def check_new_stream(self, workload: Workload, stream: str) -> None:
        """Refuse a stream past the job's cap. Called under the job's row lock, before the
        stream's row is created, so that concurrent batches cannot pass the cap together."""
        count = LogCursor.objects.filter(
            workload=workload, path__startswith=PUSHED_STREAM_PREFIX
        ).count()
        if count >= self.streams_per_job:
            raise PushRefused(
                f"Job {workload.job_id} has {count} streams of pushed batches, the most a job "
                f"may have; this batch would open another ({stream!r}) and was not stored. Send "
                "it on one of the job's streams, or without a sequence.",
                STREAM_CAP_RETRY_SECONDS,
            )

    def _run(self, script: str, workload: Workload, spent: Spent, *args: int) -> Any:
        # Where the API's request rates are counted, under the same prefix.
        throttle = cast("dict[str, Any]", settings.CACHES.get("throttle") or {})
        client = _budget_redis(str(throttle.get("LOCATION") or settings.REDIS_URL))
        prefix = throttle.get("KEY_PREFIX") or "wr"
        key = f"{prefix}:job-token-push:{self.token_id}:{workload.pk}:{spent.name.lower()}"
        return client.register_script(script)(keys=[key], args=list(args))
