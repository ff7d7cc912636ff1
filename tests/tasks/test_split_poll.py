"""A cluster's poll split across real worker processes: the snapshot, then its shards of workloads
on the workload queue, through the Redis broker, against a simulated cluster and MariaDB."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from django.conf import settings

from recovery.choices import ClusterMode
from recovery.demo.live import ensure_simulated_cluster
from recovery.models import LogCursor, ProgressSample, Workload
from recovery.simulator.cluster import SimConfig
from recovery.simulator.store import SimulationStore
from tasks import polling
from tests.tasks.test_celery_worker import BASE_DIR, database_url_for_worker

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def two_workers() -> Iterator[str]:
    """Two worker processes (as on two hosts) on a private pair of queues."""
    queue = f"test-split-{uuid.uuid4().hex[:10]}"
    env = {
        **os.environ,
        "DATABASE_URL": database_url_for_worker(),
        "REDIS_URL": settings.REDIS_URL,
        "WR_CELERY_QUEUE": queue,
        "WR_POLL_SECONDS": "5",
        "WR_WORKLOAD_SHARDS": "4",
    }
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tasks",
                "worker",
                "--pool",
                "solo",
                "--hostname",
                f"{queue}-{index}@localhost",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "--loglevel",
                "WARNING",
            ],
            cwd=BASE_DIR,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for index in range(2)
    ]
    try:
        yield queue
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            try:
                worker.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.communicate()


def test_a_split_poll_reads_every_workload_once_across_two_workers(
    two_workers: str, tmp_path: Path, settings: object
) -> None:
    """
    GIVEN a simulated cluster of six jobs, and two worker processes consuming the queues
    WHEN its poll is sent through Redis a few times, as the beat would
    THEN the snapshot queues shards on the workload queue (not the default one), the workers
         read every running job's output, and no byte is read twice (cursor offsets never
         pass the file's size, samples are not duplicated)
    """
    config = SimConfig(
        name="split-poll", nodes=24, jobs=6, seed=3, speedup=20.0, log_dir=str(tmp_path),
        faults_per_job_hour=0.0, startup_seconds=(1.0, 2.0),
    )  # fmt: skip
    cluster = ensure_simulated_cluster(config, ClusterMode.MONITOR)
    store = SimulationStore.from_url(settings.REDIS_URL, config)  # type: ignore[attr-defined]
    store.reset()
    store.publish_config()
    client = redis.Redis.from_url(settings.REDIS_URL)  # type: ignore[attr-defined]
    queue = two_workers

    deadline = time.monotonic() + 60
    results = []
    while time.monotonic() < deadline:
        store.advance(datetime.now(UTC))
        task = polling.poll_cluster.apply_async((cluster.pk,), queue=queue)
        results.append(task.get(timeout=30))
        time.sleep(1.5)
        running = Workload.objects.filter(cluster=cluster, state="running").count()
        read = LogCursor.objects.filter(workload__cluster=cluster, offset__gt=0).count()
        if running >= 3 and read >= running and len(results) >= 4:
            break
    assert any(result.get("batches") for result in results), results
    watched = list(Workload.objects.filter(cluster=cluster, state="running"))
    assert len(watched) >= 3
    for workload in watched:
        cursor = LogCursor.objects.get(workload=workload, path=workload.stdout_path)
        assert 0 < cursor.offset <= Path(workload.stdout_path).stat().st_size
    # One sample per progress point read: a byte read twice would repeat (rank, step, time).
    samples = ProgressSample.objects.filter(workload__cluster=cluster)
    keys = list(samples.values_list("workload_id", "rank", "node", "step", "at"))
    assert keys and len(keys) == len(set(keys))
    # Everything sent went to the queues the workers consume, and was consumed.
    assert client.llen(queue) == 0
    assert client.llen(f"{queue}.workloads") == 0
