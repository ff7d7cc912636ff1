"""Polling tasks: a cluster's snapshot, its workloads shard by shard, the beat's round, a hook's.

A cluster's poll is split so that any number of workers on any number of hosts share a large
cluster: ``poll_cluster`` takes the scheduler's snapshot (one listing of jobs and nodes, synced
against what is stored, under the cluster's lock), then queues ``judge_cluster`` (the
cluster-wide monitors and the pending decisions) on the default queue and ``process_workloads``
for the shards of the listed workloads (ids modulo ``WORKLOAD_SHARDS``) on the workload queue.
Each shard has a lock of its own, so a workload is never processed by two workers at once; a
shard whose previous batch still runs is skipped, and its work waits for the next poll (the
cursors, the endings to judge and the progress checks are all kept in the database).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import Any

import redis
from celery import shared_task
from django.conf import settings
from django.utils import timezone

from recovery.loop.held import tokens_for
from recovery.loop.poll import adapter_for, log_store_of
from recovery.loop.poll import judge_cluster as judge
from recovery.loop.poll import poll_cluster as poll
from recovery.loop.workloads import process_workloads as process
from recovery.models import Cluster
from recovery.schedulers.base import SchedulerAdapter, SchedulerError
from tasks.locks import held_while_running

logger = logging.getLogger(__name__)


@shared_task(name="tasks.polling.poll_cluster")
def poll_cluster(cluster_id: int) -> dict[str, Any]:
    """Sync one cluster's jobs and nodes, then queue its workloads' work. Safe to repeat.

    One snapshot per cluster at a time: a slow poll is not overtaken by the next beat's.
    """
    with cluster_locked(cluster_id, f"wr:poll:{cluster_id}") as (cluster, refusal):
        if cluster is None:
            return refusal
        try:
            summary = poll(cluster, workloads=False)
        except SchedulerError as exc:
            # An unreachable scheduler is reported, not retried in a loop: the next beat polls.
            logger.warning("poll of %s failed: %s", cluster.name, exc)
            return {"error": 1}
    # First, on the default queue and with a longer expiry than the shards: queued behind a
    # busy cluster's shards it expired every time (found by the scale bench: suspected crashes
    # went unconfirmed and nodes out of service unchecked at 1,000 jobs). Its lock keeps two
    # from running at once; what it judges is in the database, so a late run loses nothing.
    judge_cluster.apply_async(
        (cluster_id,),
        queue=settings.CELERY_TASK_DEFAULT_QUEUE,
        expires=settings.JUDGE_EXPIRES_SECONDS,
    )
    batches = queue_workloads(cluster_id, tokens_for(cluster, summary.workload_facts))
    result: dict[str, Any] = {
        key: value
        for key, value in summary.__dict__.items()
        if key not in ("workload_ids", "workload_facts")
    }
    result["batches"] = batches
    return result


@shared_task(name="tasks.polling.judge_cluster")
def judge_cluster(cluster_id: int) -> dict[str, int]:
    """The cluster-wide monitors and the pending decisions (``recovery.loop.poll.judge_cluster``),
    one run per cluster at a time; a run still going when the next poll queues one is enough."""
    with cluster_locked(cluster_id, f"wr:poll:{cluster_id}:judge") as (cluster, refusal):
        if cluster is None:
            return refusal
        new, decisions = judge(cluster)
    return {"anomalies_new": new, "decisions": decisions}


@contextlib.contextmanager
def cluster_locked(
    cluster_id: int, key: str
) -> Iterator[tuple[Cluster, dict[str, Any]] | tuple[None, dict[str, Any]]]:
    """The cluster, while this worker holds ``key``; else None and what the task returns.

    A cluster that is gone returns nothing; a lock another worker holds, ``skipped``.
    """
    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None:
        yield None, {}
        return
    client = redis.Redis.from_url(settings.REDIS_URL)
    with held_while_running(client, key, timeout_s=settings.POLL_LOCK_SECONDS) as ours:
        yield (cluster, {}) if ours else (None, {"skipped": 1})


def shard_of(workload_id: int) -> int:
    return workload_id % settings.WORKLOAD_SHARDS


# A task's workloads at least, where there are that many: a batch has fixed costs (its
# queries, its lock, the task itself), so a small cluster's shards go together.
WORKLOADS_PER_TASK = 50


def queue_workloads(cluster_id: int, tokens: dict[int, str]) -> int:
    """``process_workloads`` for every shard that holds any of the workloads of ``tokens``
    (``recovery.loop.held``), in the batches of ``workload_batches``; returns how many tasks.

    Each expires before the next poll would queue its shards again. The batches whose shards
    were processed longest ago go first: when the workers cannot do every shard in a poll
    period, the tasks that expire are not always the same shards' (in shard order the last
    shards of a busy cluster went unread for minutes, found by the scale bench on one worker).
    """
    batches = workload_batches(tokens)
    done = _shards_done(cluster_id, [shard for task_shards, _ in batches for shard in task_shards])
    batches.sort(key=lambda batch: min(done.get(shard, 0.0) for shard in batch[0]))
    for task_shards, ids in batches:
        process_workloads.apply_async(
            (cluster_id, task_shards, ids, [tokens[pk] for pk in ids]),
            queue=settings.WORKLOAD_QUEUE,
            expires=settings.POLL_SECONDS * 0.9,
        )
    return len(batches)


def workload_batches(workload_ids: Iterable[int]) -> list[tuple[list[int], list[int]]]:
    """The workloads by shard, shards packed into batches of ``WORKLOADS_PER_TASK`` workloads
    at least: (shards, workload ids) of each task to send."""
    shards: dict[int, list[int]] = {}
    for workload_id in sorted(workload_ids):
        shards.setdefault(shard_of(workload_id), []).append(workload_id)
    batches: list[tuple[list[int], list[int]]] = []
    for shard, ids in sorted(shards.items()):
        if not batches or len(batches[-1][1]) >= WORKLOADS_PER_TASK:
            batches.append(([], []))
        batches[-1][0].append(shard)
        batches[-1][1].extend(ids)
    return batches


# Adapters by cluster, settings and thread, kept by each worker process: an SSH cluster's
# connection is opened once per process (per thread of a threads pool: an SFTP session's
# pipelined requests are not shared between threads), not once per shard and poll.
_ADAPTERS: OrderedDict[tuple[int, str, str, int], SchedulerAdapter] = OrderedDict()
_ADAPTERS_LOCK = threading.Lock()
ADAPTERS_KEPT = 32


def _adapter(cluster: Cluster) -> SchedulerAdapter:
    key = (
        cluster.pk,
        str(cluster.connection),
        repr(cluster.connection_settings),
        threading.get_ident(),
    )
    with _ADAPTERS_LOCK:
        adapter = _ADAPTERS.get(key)
    if adapter is None:
        adapter = adapter_for(cluster)
    with _ADAPTERS_LOCK:
        adapter = _ADAPTERS.setdefault(key, adapter)
        _ADAPTERS.move_to_end(key)
        while len(_ADAPTERS) > ADAPTERS_KEPT:
            _ADAPTERS.popitem(last=False)
    return adapter


@shared_task(name="tasks.polling.process_workloads")
def process_workloads(
    cluster_id: int,
    shards: list[int] | int,
    workload_ids: list[int],
    tokens: list[str] | None = None,
) -> dict[str, Any]:
    """Read, judge and check the workloads of some shards (``recovery.loop.workloads``).

    Each shard's lock is taken, and only the workloads of the shards this worker holds are
    processed: ids are checked against their shard, so a message queued when the shard count
    was different cannot put a workload in two batches at once. ``tokens``, one per id, let
    this process leave alone the workloads it finds quiet (``recovery.loop.held``); a message
    without them (queued by an earlier release) has every workload processed.
    """
    wanted = {shards} if isinstance(shards, int) else {s for s in shards if isinstance(s, int)}
    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None or not wanted:
        return {}
    client = redis.Redis.from_url(settings.REDIS_URL)
    with contextlib.ExitStack() as held:
        ours = {
            shard
            for shard in sorted(wanted)
            if held.enter_context(
                held_while_running(
                    client,
                    f"wr:poll:{cluster_id}:shard:{shard}",
                    timeout_s=settings.POLL_LOCK_SECONDS,
                )
            )
        }
        if not ours:
            return {"skipped": 1}
        ids = [pk for pk in workload_ids if isinstance(pk, int) and shard_of(pk) in ours]
        held_tokens = (
            {pk: token for pk, token in zip(workload_ids, tokens, strict=True) if pk in ids}
            if isinstance(tokens, list) and len(tokens) == len(workload_ids)
            else None
        )
        try:
            transport = _adapter(cluster).transport
        except SchedulerError as exc:
            logger.warning("workloads of %s not read: %s", cluster.name, exc)
            return {"error": 1}
        summary = process(
            cluster,
            ids,
            transport,
            timezone.now(),
            log_store=log_store_of(cluster),
            tokens=held_tokens,
        )
        _mark_shards_done(client, cluster_id, ours)
    return {**summary.__dict__, "shards_skipped": len(wanted) - len(ours)}


# How long a shard's last processing is remembered for ordering the next poll's batches.
SHARD_DONE_KEPT_SECONDS = 3600


def _shard_done_key(cluster_id: int, shard: int) -> str:
    return f"wr:poll:{cluster_id}:shard:{shard}:done"


def _mark_shards_done(client: redis.Redis, cluster_id: int, shards: Iterable[int]) -> None:
    now = time.time()
    try:
        with client.pipeline(transaction=False) as pipe:
            for shard in shards:
                pipe.set(_shard_done_key(cluster_id, shard), now, ex=SHARD_DONE_KEPT_SECONDS)
            pipe.execute()
    except redis.RedisError as exc:
        # Only the order of the next poll's batches depends on it.
        logger.warning("could not note the shards of cluster %s done: %s", cluster_id, exc)


def _shards_done(cluster_id: int, shards: list[int]) -> dict[int, float]:
    """When each shard was last processed (epoch seconds); a shard never processed, or not
    known after a Redis restart, is missing (first in line)."""
    if not shards:
        return {}
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        values = client.mget([_shard_done_key(cluster_id, shard) for shard in shards])
    except redis.RedisError as exc:
        logger.warning(
            "could not read when the shards of cluster %s were done: %s", cluster_id, exc
        )
        return {}
    done: dict[int, float] = {}
    for shard, value in zip(shards, values, strict=True):
        if value is None:
            continue
        try:
            done[shard] = float(value)
        except ValueError:
            continue  # not a time this code wrote: first in line
    return done


def queue_poll(cluster_id: int) -> None:
    """Queue one poll of the cluster now, for a scheduler hook (``recovery.loop.scheduler_hooks``).

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
    clusters = [cluster.pk for cluster in Cluster.objects.all() if cluster.is_polled]
    for cluster_id in clusters:
        poll_cluster.apply_async((cluster_id,), expires=settings.POLL_SECONDS * 0.9)
    return len(clusters)
