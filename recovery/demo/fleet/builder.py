"""The machinery the demo stories are told with: the builder, which writes clusters, nodes and
policies, and has each story told whole in one transaction, counting what it created.

How a story is told (in its own time, through the loop's own functions) is ``story``'s; the
commands a story's controller runs are here, beside the builder, for the stories to name.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from recovery.choices import WorkloadState
from recovery.demo.fleet.clock import story_clock
from recovery.demo.fleet.parts import NodeSpec, SeedSummary
from recovery.demo.fleet.story import Story
from recovery.models import (
    Anomaly,
    Attempt,
    AuditEvent,
    Cluster,
    Node,
    Policy,
    Recommendation,
    Verdict,
    Workflow,
    Workload,
)

# A story: what happens to one workload, told to the ``Story`` that records it.
Build = Callable[["Story"], None]


class Builder:
    """Writes clusters, nodes, policies and stories; counts what it created."""

    def __init__(self, now: datetime, rng: random.Random) -> None:
        self.now = now
        self.rng = rng
        self.summary = SeedSummary()

    def ago(self, hours: float = 0, minutes: float = 0, seconds: float = 0) -> datetime:
        return self.now - timedelta(hours=hours, minutes=minutes, seconds=seconds)

    def latency(self) -> timedelta:
        return timedelta(seconds=self.rng.randint(3, 9))

    def cluster(self, name: str, **defaults: Any) -> Cluster:
        cluster, created = Cluster.objects.get_or_create(
            name=name, defaults={**defaults, "last_polled_at": self.now}
        )
        self.summary.clusters += created
        return cluster

    def policy(self, cluster: Cluster, name: str, **fields: Any) -> Policy:
        """The cluster's own policy, which its stories' decisions follow."""
        policy, _ = Policy.objects.get_or_create(name=name, defaults={"cluster": cluster, **fields})
        return policy

    def nodes(self, cluster: Cluster, names: Sequence[str], specs: dict[str, NodeSpec]) -> None:
        for name in names:
            spec = specs.get(name, NodeSpec())
            implicated_at = (
                self.ago(hours=spec.implicated_hours_ago)
                if spec.implicated_hours_ago is not None
                else None
            )
            excluded_until = (
                implicated_at + timedelta(hours=spec.excluded_hours)
                if implicated_at is not None and spec.excluded_hours
                else None
            )
            _, created = Node.objects.get_or_create(
                cluster=cluster,
                name=name,
                defaults={
                    "scheduler_state": spec.state,
                    "state_reason": spec.reason,
                    "health": spec.health,
                    "times_implicated": spec.times_implicated,
                    "last_implicated_at": implicated_at,
                    "excluded_until": excluded_until,
                },
            )
            self.summary.nodes += created

    def story(
        self,
        cluster: Cluster,
        job_id: str,
        build: Build,
        *,
        controller: str,
        **fields: Any,
    ) -> None:
        """Write one workload and everything under it in one transaction, unless it exists.

        The trail is append-only, so a story is told once, whole, or not at all.
        """
        if Workload.objects.filter(cluster=cluster, job_id=job_id).exists():
            return
        with transaction.atomic():
            before = _counts(cluster)
            with story_clock(fields["submit_time"]):
                if fields.get("workflow"):
                    fields["workflow"], _ = Workflow.objects.get_or_create(
                        cluster=cluster, user=fields["user"], name=fields["workflow"]
                    )
                workload = Workload.objects.create(
                    cluster=cluster,
                    job_id=job_id,
                    state=WorkloadState.PENDING,
                    current_attempt=0,
                    **fields,
                )
            story = Story(self, workload, controller)
            build(story)
            story.flush()
            after = _counts(cluster)
        self.summary.workloads += after[Workload] - before[Workload]
        self.summary.attempts += after[Attempt] - before[Attempt]
        self.summary.anomalies += after[Anomaly] - before[Anomaly]
        self.summary.verdicts += after[Verdict] - before[Verdict]
        self.summary.recommendations += after[Recommendation] - before[Recommendation]
        self.summary.events += after[AuditEvent] - before[AuditEvent]


def _counts(cluster: Cluster) -> dict[type, int]:
    return {
        Workload: Workload.objects.filter(cluster=cluster).count(),
        Attempt: Attempt.objects.filter(workload__cluster=cluster).count(),
        Anomaly: Anomaly.objects.filter(workload__cluster=cluster).count(),
        Verdict: Verdict.objects.filter(anomaly__workload__cluster=cluster).count(),
        Recommendation: Recommendation.objects.filter(workload__cluster=cluster).count(),
        AuditEvent: AuditEvent.objects.filter(cluster=cluster).count(),
    }


def restart_commands(job_id: str, excluded: Sequence[str] = ()) -> list[list[str]]:
    """What the controller runs to restart a failed job, keeping ``excluded`` out."""
    commands = [["scontrol", "requeuehold", job_id]]
    if excluded:
        commands.append(
            ["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(excluded)}"]
        )
    commands.append(["scontrol", "release", job_id])
    return commands
