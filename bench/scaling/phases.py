"""One poll taken apart: timers around its phases, its queries, and a cProfile of one call."""

from __future__ import annotations

import cProfile
import functools
import io
import pstats
import time
from collections.abc import Callable
from typing import Any


def profile_poll(
    config: Any, redis_url: str, poll_seconds: int, polls: int = 1
) -> tuple[list[dict[str, tuple[float, int]]], str]:
    """Phase times and query counts of polls of ``config``'s step, then a cProfile of one more.

    The cluster's clock is advanced here before each poll, as the simulate command would,
    so each poll reads what was written while the one before it ran. The first one reads
    the output of the clock's jump over the pause since the step ended, which the simulator
    caps per job, as much as a poll of a saturated run reads.
    """
    from django.db import connection

    import recovery.loop.poll as polling
    from recovery.models import Cluster
    from recovery.simulator.adapter import SimulatedAdapter
    from recovery.simulator.store import SimulationStore

    store = SimulationStore.from_url(redis_url, config)
    cluster = Cluster.objects.get(name=config.name)
    phases: dict[str, tuple[float, int]] = {}
    queries = [0]

    def count_queries(execute: Callable[..., Any], *args: Any) -> Any:
        queries[0] += 1
        return execute(*args)

    def timed(label: str, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            began, before = time.perf_counter(), queries[0]
            try:
                return function(*args, **kwargs)
            finally:
                spent, count = phases.get(label, (0.0, 0))
                phases[label] = (
                    spent + time.perf_counter() - began,
                    count + queries[0] - before,
                )

        return wrapper

    patched: list[tuple[Any, str, Any]] = []
    targets = [
        (SimulatedAdapter, "list_nodes", "list_nodes (simulated store)"),
        (SimulatedAdapter, "list_jobs", "list_jobs (simulated store)"),
        (polling, "_sync_nodes", "sync nodes"),
        (polling, "_sync_jobs", "sync jobs"),
        (polling, "ingest_node_kernel_logs", "node kernel logs"),
        (polling, "process_workloads", "workloads (output, endings, hang/straggler)"),
        (polling, "_run_cluster_monitors", "monitors (nodes, suspects)"),
        (polling, "decide_pending", "decide_pending"),
    ]
    for owner, name, label in targets:
        original = getattr(owner, name)
        patched.append((owner, name, original))
        setattr(owner, name, timed(label, original))
    runs: list[dict[str, tuple[float, int]]] = []
    profiler = cProfile.Profile()
    try:
        with connection.execute_wrapper(count_queries):
            for index in range(polls + 1):
                time.sleep(poll_seconds)
                store.advance()
                phases.clear()
                queries[0] = 0
                began = time.perf_counter()
                if index == polls:
                    profiler.enable()
                summary = polling.poll_cluster(cluster)
                if index == polls:
                    profiler.disable()
                phases["total"] = (time.perf_counter() - began, queries[0])
                phases["summary"] = (float(summary.log_bytes), summary.jobs_seen)
                runs.append(dict(phases))
    finally:
        for owner, name, original in patched:
            setattr(owner, name, original)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(14)
    return runs, out.getvalue()
