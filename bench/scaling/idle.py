"""The idle step: what a listed job that printed nothing since the last poll costs a worker.

A simulated cluster of ``IDLE_JOBS`` jobs is started and polled until every job has printed its
start-up and the worker has read it; then its clock is held, so that nothing changes, and polls
are timed in this process as a worker runs them: the snapshot (``recovery.loop.poll.
poll_cluster`` without the workloads: the listing synced, each job's facts digested) and the
shard tasks (``tasks.polling.process_workloads``, called as a worker calls them, with the
snapshot's tokens). CPU time of this process per job poll, split in three:

* the scheduler's listing itself (the simulator's store here, ``squeue --json`` in production),
  timed alone and taken out: it is the scheduler's cost, whatever the control plane does;
* the snapshot's own work per job (digest, one query for all of them);
* the shard tasks' work per job: the locks, one stat per output file, nothing else for a
  quiet job (``recovery.loop.held``).

``idle_job_cost_ms`` is the last two: what the control plane spends on a job that did nothing.
The reference, in the same run: the same shard tasks with nothing remembered (every workload
processed as before this existed).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

IDLE_JOBS = 1000
IDLE_NODES = 4000
IDLE_POLLS = 10
TARGET_IDLE_JOB_COST_MS = 0.2


def run_idle(config: Any, redis_url: str) -> dict[str, Any]:
    """The idle step on the bench's database (emptied before) and ``config``'s cluster."""
    from recovery.choices import ClusterMode
    from recovery.demo.live import ensure_simulated_cluster
    from recovery.loop import held
    from recovery.loop.poll import adapter_for, poll_cluster
    from recovery.simulator.store import SimulationStore
    from tasks.polling import process_workloads

    store = SimulationStore.from_url(redis_url, config)
    store.reset()
    cluster = ensure_simulated_cluster(config, ClusterMode.MONITOR)
    adapter = adapter_for(cluster)
    # Long enough for every job to start and print its start-up, read as it comes.
    for _ in range(8):
        time.sleep(1.0)
        store.advance()
        summary = poll_cluster(cluster, adapter, workloads=False)
        _shards(cluster.pk, held.tokens_for(cluster, summary.workload_facts), process_workloads)

    listing: list[float] = []
    snapshot: list[float] = []
    shards: list[float] = []
    cold: list[float] = []
    left = processed = jobs = 0
    for _ in range(IDLE_POLLS):
        began = time.process_time()
        adapter.list_jobs()
        adapter.list_nodes()
        listing.append(time.process_time() - began)
        began = time.process_time()
        summary = poll_cluster(cluster, adapter, workloads=False)
        snapshot.append(time.process_time() - began)
        tokens = held.tokens_for(cluster, summary.workload_facts)
        jobs = len(tokens)
        began = time.process_time()
        results = _shards(cluster.pk, tokens, process_workloads)
        shards.append(time.process_time() - began)
        left += sum(int(r.get("left_quiet", 0)) for r in results)
        processed += sum(int(r.get("workloads", 0)) for r in results)
        # The reference: nothing remembered. What it processes is remembered again, so the
        # next poll is a warm one.
        held.forget_all()
        began = time.process_time()
        _shards(cluster.pk, tokens, process_workloads)
        cold.append(time.process_time() - began)

    def per_job_ms(values: list[float]) -> float:
        return statistics.median(values) * 1000 / max(1, jobs)

    sync_ms = max(0.0, per_job_ms(snapshot) - per_job_ms(listing))
    shard_ms = per_job_ms(shards)
    return {
        "name": "idle",
        "jobs": jobs,
        "nodes": config.nodes,
        "polls": IDLE_POLLS,
        "listing_ms_per_job": round(per_job_ms(listing), 4),
        "snapshot_sync_ms_per_job": round(sync_ms, 4),
        "shard_ms_per_job": round(shard_ms, 4),
        "idle_job_cost_ms": round(sync_ms + shard_ms, 4),
        "reference_shard_ms_per_job_nothing_remembered": round(per_job_ms(cold), 4),
        "left_quiet_share": round(left / max(1, left + processed), 4),
        "passed": sync_ms + shard_ms <= TARGET_IDLE_JOB_COST_MS,
    }


def _shards(cluster_id: int, tokens: dict[int, str], task: Any) -> list[dict[str, Any]]:
    """The shard tasks a snapshot queues, run here one after the other as a worker runs them."""
    from tasks.polling import workload_batches

    return [
        task(cluster_id, shards, ids, [tokens[pk] for pk in ids])
        for shards, ids in workload_batches(tokens)
    ]


def print_idle(figures: dict[str, Any]) -> None:
    print(
        f"\nIdle: {figures['jobs']} jobs on {figures['nodes']} nodes, nothing printed, "
        f"{figures['polls']} polls timed in this process: {figures['idle_job_cost_ms']} ms of "
        f"worker CPU per job poll (target <= {TARGET_IDLE_JOB_COST_MS:g}): the snapshot's own "
        f"{figures['snapshot_sync_ms_per_job']} ms and the shard tasks' "
        f"{figures['shard_ms_per_job']} ms ({float(figures['left_quiet_share']):.0%} left alone "
        f"as quiet); with nothing remembered the shard tasks take "
        f"{figures['reference_shard_ms_per_job_nothing_remembered']} ms a job. The scheduler's "
        f"listing itself (the simulator's store here) adds {figures['listing_ms_per_job']} ms."
    )
