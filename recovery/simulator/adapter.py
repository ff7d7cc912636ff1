"""The scheduler interface over a simulated cluster: what the poller and the controller use.

Reads take a snapshot of the shared state; actions change it under the cluster's lock. Job
output files are local files the simulator writes, read through the ordinary local transport.
"""

from __future__ import annotations

from collections.abc import Sequence

from recovery.simulator.store import SimulationStore
from recovery.sources.schedulers.base import CommandResult, JobInfo, NodeInfo, SchedulerAdapter
from recovery.sources.schedulers.transport import LocalTransport
from recovery.sources.schedulers.validation import validate_job_id, validate_node_names


class SimulatedAdapter(SchedulerAdapter):
    def __init__(self, store: SimulationStore) -> None:
        self.store = store
        self.transport = LocalTransport()

    def list_jobs(self) -> list[JobInfo]:
        return self.store.reading().jobs()

    def cluster_name(self) -> str | None:
        return self.store.config.name

    def get_job(self, job_id: str) -> JobInfo | None:
        return self.store.reading().get_job(validate_job_id(job_id))

    def list_nodes(self) -> list[NodeInfo]:
        return self.store.reading().nodes()

    def requeue(self, job_id: str, *, hold: bool = False) -> CommandResult:
        with self.store.changing() as cluster:
            return cluster.requeue(validate_job_id(job_id), hold=hold)

    def set_excluded_nodes(self, job_id: str, nodes: Sequence[str]) -> CommandResult:
        names = validate_node_names(nodes) if nodes else []
        with self.store.changing() as cluster:
            return cluster.set_excluded_nodes(validate_job_id(job_id), names)

    def clear_start_delay(self, job_id: str) -> CommandResult:
        with self.store.changing() as cluster:
            return cluster.clear_start_delay(validate_job_id(job_id))

    def release(self, job_id: str) -> CommandResult:
        with self.store.changing() as cluster:
            return cluster.release(validate_job_id(job_id))

    def hold(self, job_id: str) -> CommandResult:
        with self.store.changing() as cluster:
            return cluster.hold(validate_job_id(job_id))

    def cancel(self, job_id: str) -> CommandResult:
        with self.store.changing() as cluster:
            return cluster.cancel(validate_job_id(job_id))

    def disable_requeue(self, job_id: str) -> CommandResult:
        with self.store.changing() as cluster:
            return cluster.disable_requeue(validate_job_id(job_id))
