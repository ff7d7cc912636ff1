"""The Advisor Controller's command line and run loop, without Django.

On a login node it is the ``workload-recovery-controller`` command of the controller's own
distribution (``recovery/controller/pyproject.toml``, Python 3.9 and newer), or
``python -m recovery.controller.cli`` in a checkout; where the control plane's code and settings
are, ``manage.py advisor_controller`` runs the same loop with the same options. Nothing here, nor
anything it imports, loads Django: the controller knows the control plane only through the
Advisor API.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from recovery.controller.client import AdvisorAPIError, AdvisorClient
from recovery.controller.controller import (
    DEFAULT_LEASE_SECONDS,
    AdvisorController,
    MisconfiguredController,
)
from recovery.schedulers.base import SchedulerAdapter, SchedulerError
from recovery.schedulers.slurm import SlurmAdapter
from recovery.schedulers.ssh_transport import SSHTransport
from recovery.schedulers.transport import LocalTransport

if TYPE_CHECKING:
    from recovery.simulator.store import BaseSimulationStore

DESCRIPTION = (
    "Run the Slurm Advisor Controller: fetch ready recommendations for one cluster, claim "
    "each, read the job's current state, act only where the action has not happened yet, "
    "and report. In-cluster mode runs Slurm commands here; --ssh runs them on a login node."
)
# The console script of the controller's own distribution.
PROG = "workload-recovery-controller"
# The control plane's own default (workload_recovery/settings.py), for --simulated.
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
# An idle controller asks for ready recommendations this often. It is also how soon a standby
# notices that a killed controller's lease has lapsed (DEFAULT_LEASE_SECONDS), so the two add
# up to what a killed controller costs. One light GET per controller and pass.
DEFAULT_INTERVAL_SECONDS = 2.0


class ControllerExit(Exception):
    """The controller cannot start, or its single pass (``--once``) failed; the message says why."""


class Output(Protocol):
    def write(self, text: str, /) -> object: ...


@dataclass(frozen=True)
class ControllerOptions:
    cluster: str
    url: str
    token_file: str | None
    ssh: str | None
    known_hosts: str | None
    key: str | None
    slurm_conf: str
    simulated: bool
    partitions: list[str]
    interval: float
    lease_seconds: int
    once: bool

    @classmethod
    def from_parsed(cls, parsed: Mapping[str, Any]) -> ControllerOptions:
        """From the options ``add_arguments`` declared, as argparse or a Django command has them."""
        return cls(
            cluster=str(parsed["cluster"]),
            url=str(parsed["url"]),
            token_file=parsed["token_file"],
            ssh=parsed["ssh"],
            known_hosts=parsed["known_hosts"],
            key=parsed["key"],
            slurm_conf=str(parsed["slurm_conf"]),
            simulated=bool(parsed["simulated"]),
            partitions=[p for p in str(parsed["partitions"]).split(",") if p],
            interval=float(parsed["interval"]),
            lease_seconds=int(parsed["lease_seconds"]),
            once=bool(parsed["once"]),
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", required=True, help="the cluster this token belongs to")
    parser.add_argument("--url", default=os.environ.get("WR_ADVISOR_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--token-file", help="file holding the controller token")
    parser.add_argument("--ssh", metavar="USER@HOST[:PORT]")
    parser.add_argument("--known-hosts", help="known_hosts file (required with --ssh)")
    parser.add_argument("--key", help="private key file (required with --ssh)")
    parser.add_argument("--slurm-conf", default=os.environ.get("SLURM_CONF", ""))
    parser.add_argument(
        "--simulated",
        action="store_true",
        help="act on the simulation of --cluster (manage.py simulate) through REDIS_URL, or "
        "through its files in WR_SIMULATOR_STATE_DIR when that is set",
    )
    parser.add_argument(
        "--partitions",
        default="",
        help="comma-separated partitions this controller acts in; it can only narrow what the "
        "control plane offers, whose canary (the cluster's action partitions and share) "
        "decides which recommendations run without an approval",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL_SECONDS,
        help="seconds between passes over the ready recommendations",
    )
    parser.add_argument(
        "--lease-seconds",
        type=int,
        default=DEFAULT_LEASE_SECONDS,
        help="lease asked for each claim (10-3600), renewed while the controller acts; a "
        "standby controller takes over a claim once its controller has been gone this long",
    )
    parser.add_argument("--once", action="store_true", help="one pass, then exit")


def parse_ssh_target(target: str) -> tuple[str, str, int]:
    """``user@host[:port]`` → (user, host, port)."""
    user, at, rest = target.partition("@")
    if not at or not user or not rest:
        raise ControllerExit(f"--ssh wants USER@HOST[:PORT], got {target!r}")
    host, _, port = rest.partition(":")
    try:
        return user, host, int(port) if port else 22
    except ValueError:
        raise ControllerExit(f"--ssh port is not a number: {port!r}") from None


def run(options: ControllerOptions, *, redis_url: str, out: Output, err: Output) -> None:
    """Check the controller's identity, then carry out ready recommendations until stopped.

    ``redis_url`` is where ``--simulated`` finds the simulation. Raises ControllerExit when the
    controller must not start or, with ``--once``, when its pass could not be made.
    """
    token = os.environ.get("WR_CONTROLLER_TOKEN", "")
    if options.token_file:
        token = Path(options.token_file).read_text().strip()
    if not token:
        raise ControllerExit("give the token in WR_CONTROLLER_TOKEN or --token-file")
    controller = AdvisorController(
        AdvisorClient(options.url, token),
        scheduler_adapter(options, redis_url),
        partitions=options.partitions,
        lease_seconds=options.lease_seconds,
    )
    check_identity(controller, options, out=out, err=err)
    while True:
        try:
            for recommendation_id, outcome in controller.run_once():
                out.write(f"recommendation {recommendation_id}: {outcome}\n")
        except (AdvisorAPIError, SchedulerError) as exc:
            # The control plane or the scheduler is briefly away: try again next round.
            err.write(f"{options.cluster}: {exc}\n")
            if options.once:
                raise ControllerExit(str(exc)) from None
        if options.once:
            return
        time.sleep(options.interval)


def scheduler_adapter(options: ControllerOptions, redis_url: str) -> SchedulerAdapter:
    """Slurm run here, Slurm over SSH on a login node, or the named simulation."""
    env = {"SLURM_CONF": options.slurm_conf} if options.slurm_conf else {}
    if options.simulated:
        try:
            from recovery.simulator.adapter import SimulatedAdapter
        except ImportError:
            # The controller's own distribution ships no simulator.
            raise ControllerExit(
                "--simulated needs the control plane's code (recovery.simulator), "
                "which this installation does not have"
            ) from None

        # Set where the simulation keeps its state in files (settings.SIMULATOR_STATE_DIR).
        state_dir = os.environ.get("WR_SIMULATOR_STATE_DIR", "")
        return SimulatedAdapter(simulation(redis_url, options.cluster, state_dir=state_dir))
    if options.ssh:
        if not options.known_hosts or not options.key:
            raise ControllerExit("--ssh needs --known-hosts and --key")
        user, host, port = parse_ssh_target(options.ssh)
        transport = SSHTransport(
            host, user=user, port=port, key_file=options.key,
            known_hosts=options.known_hosts, env=env,
        )  # fmt: skip
        return SlurmAdapter(transport)
    return SlurmAdapter(LocalTransport(env=env))


def check_identity(
    controller: AdvisorController, options: ControllerOptions, *, out: Output, err: Output
) -> None:
    """Start only when the token, --cluster and the scheduler name the same cluster."""
    while True:
        try:
            identity = controller.check_identity(options.cluster)
        except MisconfiguredController as exc:
            raise ControllerExit(f"not starting: {exc}") from None
        except (AdvisorAPIError, SchedulerError) as exc:
            err.write(f"{options.cluster}: cannot check the cluster yet: {exc}\n")
            if options.once:
                raise ControllerExit(str(exc)) from None
            time.sleep(options.interval)
            continue
        instance = f" (instance {identity.instance})" if identity.instance else ""
        out.write(
            f"controller {identity.actor}{instance} serves cluster {identity.cluster} "
            f"(Slurm ClusterName {identity.scheduler_cluster_name})\n"
        )
        if identity.acts_without_approval:
            out.write(f"without an approval it acts on: {identity.acts_without_approval}\n")
        return


def simulation(
    redis_url: str, name: str, wait_seconds: float = 60.0, *, state_dir: str = ""
) -> BaseSimulationStore:
    """The running simulation of ``name``, waiting a while for it to start: published in
    ``state_dir`` when that is given, else on Redis."""
    from recovery.simulator.store import published_simulation

    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            return published_simulation(name, redis_url=redis_url, state_dir=state_dir)
        except SchedulerError as exc:
            if time.monotonic() > deadline:
                raise ControllerExit(str(exc)) from None
        time.sleep(1.0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    add_arguments(parser)
    options = ControllerOptions.from_parsed(vars(parser.parse_args(argv)))
    logging.basicConfig(
        level=os.environ.get("LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        run(
            options,
            redis_url=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL),
            out=sys.stdout,
            err=sys.stderr,
        )
    except ControllerExit as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
