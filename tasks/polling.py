"""Polling tasks: one cluster's poll, the beat's round over every cluster, a hook's poll."""

from __future__ import annotations

import logging

import redis
from celery import shared_task
from django.conf import settings

from recovery.loop.poll import is_polled
from recovery.loop.poll import poll_cluster as poll
from recovery.models import Cluster
from recovery.sources.schedulers.base import SchedulerError
from tasks.locks import held_while_running

logger = logging.getLogger(__name__)


@shared_task(name="tasks.polling.poll_cluster")
def poll_cluster(cluster_id: int) -> dict[str, int]:
    """Sync one cluster's jobs and nodes. Safe to repeat: it records differences only.

    One poll per cluster at a time: a slow poll is not overtaken by the next beat's.
    """
    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None:
        return {}
    client = redis.Redis.from_url(settings.REDIS_URL)
    with held_while_running(
        client, f"wr:poll:{cluster_id}", timeout_s=settings.POLL_LOCK_SECONDS
    ) as ours:
        if not ours:
            return {"skipped": 1}
        try:
            summary = poll(cluster)
        except SchedulerError as exc:
            # An unreachable scheduler is reported, not retried in a loop: the next beat polls.
            logger.warning("poll of %s failed: %s", cluster.name, exc)
            return {"error": 1}
    return summary.__dict__


def queue_poll(cluster_id: int) -> None:
    """Queue one poll of the cluster now, for a scheduler hook (``recovery.loop.push``).

    Like the beat's, it expires before the next round would poll the cluster anyway.
    """
    poll_cluster.apply_async(
        (cluster_id,),
        queue=settings.CELERY_TASK_DEFAULT_QUEUE,
        expires=settings.POLL_SECONDS * 0.9,
    )


@shared_task(name="tasks.polling.poll_all_clusters")
def poll_all_clusters() -> int:
    """Queue one poll per scheduler-backed cluster, each expiring before the next round."""
    clusters = [cluster.pk for cluster in Cluster.objects.all() if is_polled(cluster)]
    for cluster_id in clusters:
        poll_cluster.apply_async((cluster_id,), expires=settings.POLL_SECONDS * 0.9)
    return len(clusters)
