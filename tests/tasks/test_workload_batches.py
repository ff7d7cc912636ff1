"""How a poll's workloads are packed into tasks, and the shard locks a task takes (real Redis)."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from django.conf import settings

from tasks import polling
from tasks.locks import held_while_running
from tests.factories import ClusterFactory, WorkloadFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """What queue_workloads sends; the broker itself is covered by test_split_poll."""
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(
        polling.process_workloads, "apply_async", lambda args, **options: calls.append(args)
    )
    return calls


def test_a_small_clusters_shards_go_in_one_task(sent: list[tuple[Any, ...]]) -> None:
    assert polling.queue_workloads(7, {i: f"token {i}" for i in range(1, 11)}) == 1
    ((cluster_id, shards, ids, tokens),) = sent
    assert cluster_id == 7
    assert sorted(ids) == list(range(1, 11))
    assert tokens == [f"token {i}" for i in ids]  # each workload's own, in the same order
    assert sorted(shards) == sorted({polling.shard_of(i) for i in range(1, 11)})


def test_a_large_clusters_shards_each_get_a_task(sent: list[tuple[Any, ...]]) -> None:
    count = settings.WORKLOAD_SHARDS * polling.WORKLOADS_PER_TASK * 2
    assert polling.queue_workloads(7, dict.fromkeys(range(count), "")) == settings.WORKLOAD_SHARDS
    seen: list[int] = []
    for _, shards, ids, _ in sent:
        assert len(shards) == 1
        assert all(polling.shard_of(i) == shards[0] for i in ids)
        seen += ids
    assert sorted(seen) == list(range(count))  # every workload once


def test_a_shard_another_worker_holds_is_left_to_it() -> None:
    cluster = ClusterFactory()
    workloads = [WorkloadFactory(cluster=cluster) for _ in range(6)]
    by_shard: dict[int, list[int]] = {}
    for workload in workloads:
        by_shard.setdefault(polling.shard_of(workload.pk), []).append(workload.pk)
    busy, *free = sorted(by_shard)
    client = redis.Redis.from_url(settings.REDIS_URL)
    key = f"wr:poll:{cluster.pk}:shard:{busy}"
    with held_while_running(client, key, timeout_s=15) as ours:
        assert ours
        result = polling.process_workloads(cluster.pk, sorted(by_shard), [w.pk for w in workloads])
    assert result["shards_skipped"] == 1
    assert result["workloads"] == sum(len(by_shard[shard]) for shard in free)
    held_by_all = [f"wr:poll:{cluster.pk}:shard:{shard}" for shard in by_shard]
    assert not any(client.exists(name) for name in held_by_all)  # all released


def test_the_shards_processed_longest_ago_are_queued_first(sent: list[tuple[Any, ...]]) -> None:
    """A worker that cannot do every shard in a poll period lets the last tasks expire: the
    shards it did least lately go first, so that no shard is left unread poll after poll."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    count = settings.WORKLOAD_SHARDS * polling.WORKLOADS_PER_TASK * 2
    tokens = dict.fromkeys(range(count), "")
    polling._mark_shards_done(client, 7, range(settings.WORKLOAD_SHARDS))
    polling._mark_shards_done(client, 7, [0, 1])  # done again, later
    try:
        polling.queue_workloads(7, tokens)
        order = [shards[0] for _, shards, _, _ in sent]
        assert order[-2:] == [0, 1]
        assert sorted(order) == list(range(settings.WORKLOAD_SHARDS))
        sent.clear()
        client.delete(polling._shard_done_key(7, 5))  # never done (or Redis restarted)
        polling.queue_workloads(7, tokens)
        assert sent[0][1][0] == 5
    finally:
        client.delete(*[polling._shard_done_key(7, s) for s in range(settings.WORKLOAD_SHARDS)])
