"""The scheduler interface over a simulated cluster: what the poller and the controller use.

Reads take a snapshot of the shared state; actions change it under the cluster's lock. Job
output files are local files the simulator writes, read through the ordinary local transport.

The adapter also plays the chaos a harness sets in the state (``set_chaos`` on the store), all
off by default:

- ``unreachable_until``: until then every call raises SchedulerError without a result, as
  when the connection is refused. Nothing reached the scheduler: a refused command is not
  journaled, only counted (``refused_while_unreachable``). Reads do not take the lock.
- ``timeouts_after_effect``: the next so many effective commands take effect, are journaled
  and saved, then raise SchedulerError without a result: the caller cannot tell they ran.
- ``kills_after_command``: the next so many effective commands take effect, are journaled
  and saved, then their process SIGKILLs itself, as a controller dying between two commands
  of one action. Only processes that opted in with ``WR_SIM_KILLABLE=1`` (the harness sets it
  for controllers) count; for them it comes before a timeout.

``WR_SIM_CALLER`` labels the commands this process sends in the journal (default
``pid:<pid>``).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from recovery.schedulers.base import (
    Command,
    CommandResult,
    Connection,
    JobInfo,
    NodeInfo,
    SchedulerAdapter,
    SchedulerError,
)
from recovery.schedulers.registry import NotPolled, register
from recovery.schedulers.slurm import SLURM_CAPABILITIES
from recovery.schedulers.transport import LocalTransport
from recovery.schedulers.validation import validate_job_id, validate_node_names
from recovery.simulator.cluster import SimulatedCluster
from recovery.simulator.store import BaseSimulationStore, config_from_settings, simulation_store

# What the real adapter waits for a Slurm command (Transport.run's default timeout).
COMMAND_TIMEOUT_SECONDS = 30

ClusterCommand = Callable[[SimulatedCluster, str], CommandResult]


class SimulatedAdapter(SchedulerAdapter):
    # The simulated Slurm does what Slurm does.
    capabilities = SLURM_CAPABILITIES

    def __init__(self, store: BaseSimulationStore, *, caller: str | None = None) -> None:
        self.store = store
        self.transport = LocalTransport()
        self._caller = caller

    @property
    def caller(self) -> str:
        """This process's label in the journal; read per call, as a forked worker has its own."""
        return self._caller or os.environ.get("WR_SIM_CALLER") or f"pid:{os.getpid()}"

    def list_jobs(self) -> list[JobInfo]:
        return self._reachable().jobs()

    def cluster_name(self) -> str | None:
        self._reachable()
        return self.store.config.name

    def get_job(self, job_id: str) -> JobInfo | None:
        job_id = validate_job_id(job_id)
        return self._reachable().get_job(job_id)

    def list_nodes(self) -> list[NodeInfo]:
        return self._reachable().nodes()

    def requeue(self, job_id: str, *, hold: bool = False) -> CommandResult:
        job_id = validate_job_id(job_id)
        return self._send(lambda cluster, caller: cluster.requeue(job_id, hold=hold, caller=caller))

    def set_excluded_nodes(self, job_id: str, nodes: Sequence[str]) -> CommandResult:
        job_id = validate_job_id(job_id)
        names = validate_node_names(nodes) if nodes else []
        return self._send(
            lambda cluster, caller: cluster.set_excluded_nodes(job_id, names, caller=caller)
        )

    def clear_start_delay(self, job_id: str) -> CommandResult:
        job_id = validate_job_id(job_id)
        return self._send(lambda cluster, caller: cluster.clear_start_delay(job_id, caller=caller))

    def release(self, job_id: str) -> CommandResult:
        job_id = validate_job_id(job_id)
        return self._send(lambda cluster, caller: cluster.release(job_id, caller=caller))

    def hold(self, job_id: str) -> CommandResult:
        job_id = validate_job_id(job_id)
        return self._send(lambda cluster, caller: cluster.hold(job_id, caller=caller))

    def cancel(self, job_id: str) -> CommandResult:
        job_id = validate_job_id(job_id)
        return self._send(lambda cluster, caller: cluster.cancel(job_id, caller=caller))

    def disable_requeue(self, job_id: str) -> CommandResult:
        job_id = validate_job_id(job_id)
        return self._send(lambda cluster, caller: cluster.disable_requeue(job_id, caller=caller))

    def drain_node(self, name: str, reason: str) -> CommandResult:
        # Refuses a name or a reason the Slurm adapter would refuse, before anything is sent.
        self.planned_node_argv(Command.DRAIN_NODE, name, reason)
        name = validate_node_names([name])[0]
        return self._send(lambda cluster, caller: cluster.drain(name, reason, caller=caller))

    def resume_node(self, name: str) -> CommandResult:
        name = validate_node_names([name])[0]
        return self._send(lambda cluster, caller: cluster.resume(name, caller=caller))

    def _reachable(self) -> SimulatedCluster:
        """A snapshot of the cluster, unless an outage keeps the scheduler out of reach."""
        cluster = self.store.shared_reading()
        outage = self._outage(cluster)
        if outage:
            raise SchedulerError(outage)
        return cluster

    def _outage(self, cluster: SimulatedCluster) -> str:
        until = cluster.chaos["unreachable_until"]
        if until is None or until <= time.time():
            return ""
        return (
            f"simulated scheduler of {self.store.config.name} is unreachable: connection "
            f"refused (an outage until {datetime.fromtimestamp(until, tz=UTC):%H:%M:%S} UTC)"
        )

    def _send(self, command: ClusterCommand) -> CommandResult:
        """Run ``command`` under the lock and save it, refused or not, then play the chaos."""
        killable = os.environ.get("WR_SIM_KILLABLE") == "1"
        result: CommandResult | None = None
        refused: SchedulerError | None = None
        timed_out = killed = False
        with self.store.changing() as cluster:
            chaos = cluster.chaos
            outage = self._outage(cluster)
            if outage:
                chaos["refused_while_unreachable"] += 1
            else:
                # A refused command is saved too: its journal entry is what the scheduler saw.
                try:
                    result = command(cluster, self.caller)
                except SchedulerError as exc:
                    refused = exc
                entry = cluster.commands[-1]
                if entry["effective"] and killable and chaos["kills_after_command"] > 0:
                    chaos["kills_after_command"] -= 1
                    entry["killed_after"] = killed = True
                elif entry["effective"] and chaos["timeouts_after_effect"] > 0:
                    chaos["timeouts_after_effect"] -= 1
                    entry["timed_out_after"] = timed_out = True
        # Only now that it is saved and the lock is free.
        if killed:
            os.kill(os.getpid(), signal.SIGKILL)
        if outage:
            raise SchedulerError(outage)
        if refused is not None:
            raise refused
        assert result is not None
        if timed_out:
            raise SchedulerError(
                f"`{' '.join(result.argv)}` timed out after {COMMAND_TIMEOUT_SECONDS} s "
                f"waiting for {result.argv[0]}"
            )
        return result


@register(Connection.SIMULATED, SimulatedAdapter.capabilities)
def simulated(settings: Mapping[str, Any]) -> SchedulerAdapter:
    """A running simulation, shared through Redis or files; none behind a recorded demo history."""
    if "simulator" not in settings:
        raise NotPolled(Connection.SIMULATED)
    from django.conf import settings as django_settings

    config = config_from_settings(dict(settings["simulator"]))
    store = simulation_store(
        config,
        redis_url=django_settings.REDIS_URL,
        state_dir=django_settings.SIMULATOR_STATE_DIR,
    )
    return SimulatedAdapter(store)
