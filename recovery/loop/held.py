"""What a worker process remembers of the workloads it processed, so that a quiet one costs
nothing: no query, no read, no check, until its output grows, its facts change or a check is due.

Most of a large cluster's jobs print nothing between two polls most of the time (a step every
minute, a long evaluation, a checkpoint save). Processing one anyway costs its rows, its
cursors and, every half minute, a progress check over up to two thousand samples. A job is
left alone when all of these hold, as this process last saw it:

* the snapshot's token for it is the same: the digest of the scheduler facts its workload was
  synced from (a new attempt, an ending to judge, an opt-out all change it), with the cluster's
  settings, the policies and their bindings (a shorter hang timeout changes what is due);
* each of its output files has the size it had when this process read it to the end (one stat
  per file, batched per host by the transport);
* no check is due: a hang is found only once the silence passes what the last check allowed
  (``recovery.loop.monitors.ProgressCheck.recheck_at``), and nothing else changes without new
  output;
* it was processed less than ``HELD_FOR`` ago, a bound on anything the tokens do not see.

What is remembered is never the truth, only a reason to skip: another worker that moved a
cursor or checked meanwhile makes this one process the workload again, which finds nothing new
and costs what it always did. A process that restarts remembers nothing and processes
everything once.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, Max

from recovery.models import Cluster, EnvironmentBinding, Policy

# The longest a workload is left alone on what this process remembers of it.
HELD_FOR = timedelta(minutes=5)
# Workloads remembered per process, the least recently processed forgotten first: a worker
# serves every cluster of the control plane.
HELD_MAX = 200_000


@dataclass(frozen=True)
class Held:
    token: str
    # Each output file's size when it was last read to the end (None: it did not exist).
    sizes: Mapping[str, int | None]
    recheck_at: datetime
    held_at: datetime


_HELD: OrderedDict[tuple[int, int], Held] = OrderedDict()
# A worker of Celery's threads pool runs shard tasks side by side in one process.
_HELD_LOCK = threading.Lock()


def settings_token(cluster: Cluster) -> str:
    """What, besides a job's facts, changes what processing its workload does: the cluster's
    settings, the policies and the environment bindings that choose among them. Two queries
    per snapshot."""
    policies = Policy.objects.aggregate(count=Count("id"), newest=Max("updated_at"))
    bindings = list(EnvironmentBinding.objects.order_by("pk").values_list())
    seen = repr((cluster.updated_at, policies["count"], policies["newest"], bindings))
    return hashlib.sha256(seen.encode()).hexdigest()[:16]


def tokens_for(cluster: Cluster, facts: Mapping[int, str]) -> dict[int, str]:
    """Each workload's token from the digest of its synced facts (``PollSummary.
    workload_facts``), with the cluster's settings and the policies."""
    settings = settings_token(cluster)
    return {workload_id: f"{digest[:24]}|{settings}" for workload_id, digest in facts.items()}


def quiet(
    cluster_id: int,
    tokens: Mapping[int, str],
    sizes: Mapping[str, int | None],
    now: datetime,
) -> set[int]:
    """The workloads of ``tokens`` this process may leave alone now, given each output's
    size now (``sizes``: every path of every remembered workload; one missing is not quiet)."""
    left: set[int] = set()
    for workload_id, token in tokens.items():
        with _HELD_LOCK:
            held = _HELD.get((cluster_id, workload_id))
        if (
            held is None
            or held.token != token
            or now >= held.recheck_at
            or not held.held_at <= now < held.held_at + HELD_FOR
        ):
            continue
        if all(path in sizes and sizes[path] == size for path, size in held.sizes.items()):
            left.add(workload_id)
    return left


def remembered_paths(cluster_id: int, workload_ids: Iterable[int]) -> list[str]:
    """The output files of the workloads this process remembers: to stat before ``quiet``."""
    paths: dict[str, None] = {}
    for workload_id in workload_ids:
        with _HELD_LOCK:
            held = _HELD.get((cluster_id, workload_id))
        if held is not None:
            paths.update(dict.fromkeys(held.sizes))
    return list(paths)


def remember(cluster_id: int, workload_id: int, held: Held) -> None:
    key = (cluster_id, workload_id)
    with _HELD_LOCK:
        _HELD[key] = held
        _HELD.move_to_end(key)
        while len(_HELD) > HELD_MAX:
            _HELD.popitem(last=False)


def forget(cluster_id: int, workload_id: int) -> None:
    with _HELD_LOCK:
        _HELD.pop((cluster_id, workload_id), None)


def forget_all() -> None:
    with _HELD_LOCK:
        _HELD.clear()
