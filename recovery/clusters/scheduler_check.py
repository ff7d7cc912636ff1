"""What the system reads from a cluster's scheduler: the first thing to run when connecting one.

For each job and node the adapter sees, the facts the loop would act on, and every fact it
could not read with the reason. Nothing is written and nothing is done to the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from recovery.models import Cluster
from recovery.models.cluster import scheduler_cluster_name
from recovery.schedulers.base import (
    ACTIONABLE_FIELDS,
    Connection,
    JobInfo,
    NodeInfo,
    SchedulerAdapter,
    SchedulerError,
)


@dataclass
class SchedulerCheck:
    cluster: str
    reached_via: str
    slurm_version: str | None = None
    cluster_name: str | None = None
    expected_cluster_name: str = ""
    jobs: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def as_json(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "reached_via": self.reached_via,
            "slurm_version": self.slurm_version,
            "cluster_name": self.cluster_name,
            "expected_cluster_name": self.expected_cluster_name,
            "jobs": self.jobs,
            "nodes": self.nodes,
            "unreadable": self.unreadable,
            "errors": self.errors,
        }


def connection_description(cluster: Cluster) -> str:
    """How the scheduler is reached, in words (never the key's contents)."""
    settings = cluster.connection_settings or {}
    conf = f" with SLURM_CONF={settings['slurm_conf']}" if settings.get("slurm_conf") else ""
    if cluster.connection == Connection.SSH:
        where = (
            f"{settings.get('user', '?')}@{settings.get('host', '?')}:{settings.get('port', 22)}"
        )
        return f"SSH to {where}, host key checked against {settings.get('known_hosts', '?')}{conf}"
    if cluster.connection == Connection.LOCAL:
        return f"commands run on this host{conf}"
    return f"{cluster.connection} connection"


def check_scheduler(cluster: Cluster, adapter: SchedulerAdapter) -> SchedulerCheck:
    check = SchedulerCheck(
        cluster=cluster.name,
        reached_via=connection_description(cluster),
        expected_cluster_name=scheduler_cluster_name(cluster),
    )
    try:
        check.slurm_version = adapter.scheduler_version()
        check.cluster_name = adapter.cluster_name()
    except SchedulerError as exc:
        check.errors.append(f"cannot read the scheduler's version and name: {exc}")
    if check.slurm_version is None:
        check.unreadable.append("slurm_version: the scheduler did not report it")
    if check.cluster_name is None:
        check.unreadable.append("cluster_name: the scheduler did not report its ClusterName")
    elif check.cluster_name != check.expected_cluster_name:
        check.errors.append(
            f"the scheduler calls itself {check.cluster_name!r}, but cluster {cluster.name!r} "
            f"expects {check.expected_cluster_name!r} (connection setting "
            "scheduler_cluster_name): a controller would refuse to start"
        )
    try:
        jobs = adapter.list_jobs()
    except SchedulerError as exc:
        check.errors.append(f"cannot list jobs: {exc}")
        jobs = []
    try:
        nodes = adapter.list_nodes()
    except SchedulerError as exc:
        check.errors.append(f"cannot list nodes: {exc}")
        nodes = []
    for job in jobs:
        check.jobs.append(job_facts(job))
        for name, why in sorted(job.unknown(ACTIONABLE_FIELDS).items()):
            check.unreadable.append(f"job {job.job_id}: {name}: {why}")
    check.nodes = [node_facts(node) for node in nodes]
    for node in nodes:
        for name, why in sorted(node.unknown().items()):
            check.unreadable.append(f"node {node.name}: {name}: {why}")
    return check


def job_facts(job: JobInfo) -> dict[str, Any]:
    return {
        "job_id": job.job_id,
        "name": job.name,
        "user": job.user or None,
        "state": job.native_state,
        "phase": str(job.phase) if job.phase is not None else None,
        "submit_time": job.submit_time.isoformat() if job.submit_time else None,
        "nodes": job.nodes,
        "excluded_nodes": job.excluded_nodes,
        "restart_count": job.restart_count,
        "held": job.held,
        "requeue_allowed": job.requeue_allowed,
        "opted_in": job.opt_in.opted_in,
        "opt_in": job.opt_in.summary if job.opt_in.opted_in else job.opt_in.reason,
        "unreadable": dict(job.unreadable),
    }


def node_facts(node: NodeInfo) -> dict[str, Any]:
    return {"name": node.name, "state": node.state, "flags": node.flags, "reason": node.reason}


def format_check(check: SchedulerCheck) -> list[str]:
    """The check as lines for a terminal."""
    unknown = "unknown"
    lines = [
        f"cluster {check.cluster}: {check.reached_via}",
        f"  Slurm {check.slurm_version or unknown}, ClusterName {check.cluster_name or unknown}"
        f" (expected {check.expected_cluster_name})",
        f"jobs ({len(check.jobs)}):",
    ]
    for job in check.jobs:
        excluded = (
            unknown if job["excluded_nodes"] is None else ",".join(job["excluded_nodes"]) or "-"
        )
        lines.append(
            f"  {job['job_id']:<12} {job['state'] or unknown:<11} "
            f"submitted {job['submit_time'] or unknown}  user {job['user'] or unknown}  "
            f"restarts {_shown(job['restart_count'])}  nodes {','.join(job['nodes']) or '-'}  "
            f"excluded {excluded}"
        )
        verdict = job["opt_in"] if job["opted_in"] else f"not opted in: {job['opt_in']}"
        lines.append(f"  {'':<12} {verdict}")
    lines.append(f"nodes ({len(check.nodes)}):")
    for node in check.nodes:
        state = "+".join([node["state"] or unknown, *node["flags"]])
        reason = f"  ({node['reason']})" if node["reason"] else ""
        lines.append(f"  {node['name']:<16} {state}{reason}")
    lines.append(f"could not read ({len(check.unreadable)}):")
    lines.extend(f"  {item}" for item in check.unreadable)
    if check.errors:
        lines.append("errors:")
        lines.extend(f"  {error}" for error in check.errors)
    return lines


def _shown(value: object) -> str:
    return "unknown" if value is None else str(value)
