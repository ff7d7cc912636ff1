"""Failed tasks, counted in Redis for /metrics (``wr_task_failures_total``)."""

from __future__ import annotations

import logging
from typing import Any

import redis

from recovery.read import self_metrics

logger = logging.getLogger(__name__)


def record_task_failure(sender: Any = None, **_signal: Any) -> None:
    """Celery ``task_failure`` receiver: count one failure of the task ``sender``.

    A Redis outage must not turn a task failure into a crash of the worker's signal dispatch:
    the failure is then only logged (Celery logs the task's own error anyway).
    """
    name = str(getattr(sender, "name", None) or sender or "unknown")
    try:
        with self_metrics.redis_for_figures() as client:
            client.hincrby(self_metrics.TASK_FAILURES_KEY, name, 1)
    except redis.RedisError as exc:
        logger.warning("could not count the failure of task %s: %s", name, exc)
