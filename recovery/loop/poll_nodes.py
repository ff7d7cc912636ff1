"""The cluster's nodes in a poll: stored as the scheduler lists them (step 2), and those out
of service checked once every source had its say (step 8).

Apart from the jobs' sync because both go node by node over the whole cluster, whichever jobs
were listed; the checks keep a per-process memory of what was checked lately
(``_NODES_CHECKED``), so that a node out of service is not judged anew at every poll.
"""

from __future__ import annotations

import functools
import operator
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from recovery.loop.logs import OnNode, attempts_by_node
from recovery.loop.monitors import OUT_OF_SERVICE_WORDS, check_node, check_suspects
from recovery.models import Cluster, Node
from recovery.schedulers.base import NodeInfo

# ``monitors.out_of_service`` as a filter, so that only those nodes are read.
OUT_OF_SERVICE = functools.reduce(
    operator.or_,
    [Q(scheduler_state__icontains=word) for word in OUT_OF_SERVICE_WORDS],
    Q(scheduler_state__contains="*"),
)


# A node out of service is checked at once for an attempt that is new on it or when the node
# changed, and otherwise at most this often: a check that changed nothing records nothing new
# unless a workload on the node started failing meanwhile (a node that stops responding is
# then its cause).
NODE_RECHECK_SECONDS = 30.0
# (cluster, node, what of the node and which attempt was checked) -> when, kept by each worker
# process: a worker that has not seen it checks it, so losing this memory costs one check.
_NODES_CHECKED: dict[tuple[int, str, str], datetime] = {}
NODES_CHECKED_KEPT = 100_000


def _due_on_node(
    cluster: Cluster, node: Node, on_node: list[OnNode], now: datetime
) -> list[OnNode] | None:
    """The attempts on ``node`` to check now; None when nothing is due at all.

    ``node.updated_at`` tells a node of another life (another test, a re-created row) apart.
    """
    seen = repr((node.scheduler_state, node.state_reason, node.health, node.updated_at))
    fresh = timedelta(seconds=NODE_RECHECK_SECONDS)

    def due(key: tuple[int, str, str]) -> bool:
        last = _NODES_CHECKED.get(key)
        if last is not None and timedelta(0) <= now - last < fresh:
            return False
        _NODES_CHECKED[key] = now
        return True

    if len(_NODES_CHECKED) > NODES_CHECKED_KEPT:
        _NODES_CHECKED.clear()
    node_due = due((cluster.pk, node.name, seen))
    entries = [
        entry
        for entry in on_node
        if due((cluster.pk, node.name, f"{seen}|{entry[1].pk}|{entry[1].exit_state}|{entry[2]}"))
    ]
    if node_due:
        return on_node
    return entries or None


def _run_cluster_monitors(cluster: Cluster, now: datetime) -> int:
    """After the sources had their say: nodes out of service, suspected crashes settled.

    How each attempt ended and the hang and straggler checks are per workload
    (``recovery.loop.workloads``).
    """
    new = 0
    out = list(Node.objects.filter(cluster=cluster).filter(OUT_OF_SERVICE))
    on_nodes = attempts_by_node(cluster, now, {node.name for node in out}) if out else {}
    for node in out:
        due = _due_on_node(cluster, node, on_nodes.get(node.name, []), now)
        if due is None:
            continue
        with transaction.atomic():
            new += len(check_node(cluster, node, now, {node.name: due}))
    new += len(check_suspects(cluster, now))
    return new


# What ``_sync_nodes`` keeps of each node (``Node``'s fields).
NODE_SYNCED_FIELDS = (
    "scheduler_state",
    "state_flags",
    "state_reason",
    "reason_set_by",
    "reason_set_at",
    "unreadable",
)


def _node_fields(node: NodeInfo) -> dict[str, object]:
    """What ``Node`` keeps of ``node``: enough to tell whose node it is (``Node.as_read``).

    The state whole, with every flag; the reason and who set it when; and what could not be
    read. A state that could not be read is stored as none ("") and named in ``unreadable``:
    the monitors see no state to judge, and recovery neither drains nor resumes the node.
    """
    unreadable = {**node.unreadable, **node.unknown()}
    return {
        "scheduler_state": (
            "+".join([node.state, *node.flags])[:255] if node.state is not None else ""
        ),
        "state_flags": list(node.flags),
        "state_reason": (node.reason or "")[:255],
        "reason_set_by": node.reason_set_by[:64],
        "reason_set_at": node.reason_set_at,
        "unreadable": {name: why[:300] for name, why in sorted(unreadable.items())},
    }


def _comparable(fields: dict[str, object]) -> tuple[object, ...]:
    return tuple(
        repr(sorted(value.items())) if isinstance(value, dict) else repr(value)
        for value in (fields[name] for name in NODE_SYNCED_FIELDS)
    )


def _sync_nodes(cluster: Cluster, nodes: list[NodeInfo]) -> None:
    """Store the nodes as the scheduler reports them; only new nodes and changed ones are
    written."""
    stored = {
        row[0]: _comparable(dict(zip(NODE_SYNCED_FIELDS, row[1:], strict=True)))
        for row in Node.objects.filter(cluster=cluster).values_list("name", *NODE_SYNCED_FIELDS)
    }
    new: list[Node] = []
    changed: dict[tuple[object, ...], tuple[dict[str, object], list[str]]] = {}
    for node in nodes:
        wanted = _node_fields(node)
        key = _comparable(wanted)
        if node.name not in stored:
            new.append(Node(cluster=cluster, name=node.name, **wanted))
        elif stored[node.name] != key:
            changed.setdefault(key, (wanted, []))[1].append(node.name)
    with transaction.atomic():
        # Another worker may have added the same node a moment ago: it is the same row.
        Node.objects.bulk_create(new, ignore_conflicts=True)
        for wanted, names in changed.values():
            Node.objects.filter(cluster=cluster, name__in=names).update(
                **wanted, updated_at=timezone.now()
            )
