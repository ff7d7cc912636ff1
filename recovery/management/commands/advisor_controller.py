from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from recovery.controller.client import AdvisorAPIError, AdvisorClient
from recovery.controller.controller import AdvisorController, MisconfiguredController
from recovery.simulator.store import SimulationStore
from recovery.sources.schedulers.base import SchedulerAdapter, SchedulerError, Transport
from recovery.sources.schedulers.slurm import SlurmAdapter
from recovery.sources.schedulers.transport import LocalTransport, SSHTransport

logger = logging.getLogger(__name__)


def parse_ssh_target(target: str) -> tuple[str, str, int]:
    """``user@host[:port]`` → (user, host, port)."""
    user, at, rest = target.partition("@")
    if not at or not user or not rest:
        raise CommandError(f"--ssh wants USER@HOST[:PORT], got {target!r}")
    host, _, port = rest.partition(":")
    try:
        return user, host, int(port) if port else 22
    except ValueError:
        raise CommandError(f"--ssh port is not a number: {port!r}") from None


class Command(BaseCommand):
    help = (
        "Run the Slurm Advisor Controller: fetch ready recommendations for one cluster, claim "
        "each, read the job's current state, act only where the action has not happened yet, "
        "and report. In-cluster mode runs Slurm commands here; --ssh runs them on a login node."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--cluster", required=True, help="the cluster this token belongs to")
        parser.add_argument(
            "--url", default=os.environ.get("WR_ADVISOR_URL", "http://127.0.0.1:8000")
        )
        parser.add_argument("--token-file", help="file holding the controller token")
        parser.add_argument("--ssh", metavar="USER@HOST[:PORT]")
        parser.add_argument("--known-hosts", help="known_hosts file (required with --ssh)")
        parser.add_argument("--key", help="private key file (required with --ssh)")
        parser.add_argument("--slurm-conf", default=os.environ.get("SLURM_CONF", ""))
        parser.add_argument(
            "--simulated",
            action="store_true",
            help="act on the simulation of --cluster (manage.py simulate) through REDIS_URL",
        )
        parser.add_argument("--partitions", default="", help="comma-separated allowlist")
        parser.add_argument("--interval", type=float, default=5.0)
        parser.add_argument("--lease-seconds", type=int, default=120)
        parser.add_argument("--once", action="store_true", help="one pass, then exit")

    def handle(self, *args: Any, **options: Any) -> None:
        token = os.environ.get("WR_CONTROLLER_TOKEN", "")
        if options["token_file"]:
            token = Path(options["token_file"]).read_text().strip()
        if not token:
            raise CommandError("give the token in WR_CONTROLLER_TOKEN or --token-file")
        env = {"SLURM_CONF": options["slurm_conf"]} if options["slurm_conf"] else {}
        transport: Transport
        adapter: SchedulerAdapter
        if options["simulated"]:
            from recovery.simulator.adapter import SimulatedAdapter

            store = self._simulation(options["cluster"])
            adapter = SimulatedAdapter(store)
        elif options["ssh"]:
            if not options["known_hosts"] or not options["key"]:
                raise CommandError("--ssh needs --known-hosts and --key")
            user, host, port = parse_ssh_target(options["ssh"])
            transport = SSHTransport(
                host, user=user, port=port, key_file=options["key"],
                known_hosts=options["known_hosts"], env=env,
            )  # fmt: skip
            adapter = SlurmAdapter(transport)
        else:
            adapter = SlurmAdapter(LocalTransport(env=env))
        controller = AdvisorController(
            AdvisorClient(options["url"], token),
            adapter,
            partitions=[p for p in options["partitions"].split(",") if p],
            lease_seconds=options["lease_seconds"],
        )
        self._check_identity(controller, options)
        while True:
            try:
                for recommendation_id, outcome in controller.run_once():
                    self.stdout.write(f"recommendation {recommendation_id}: {outcome}")
            except (AdvisorAPIError, SchedulerError) as exc:
                # The control plane or the scheduler is briefly away: try again next round.
                self.stderr.write(f"{options['cluster']}: {exc}")
                if options["once"]:
                    raise CommandError(str(exc)) from None
            if options["once"]:
                return
            time.sleep(options["interval"])

    def _check_identity(self, controller: AdvisorController, options: dict[str, Any]) -> None:
        """Start only when the token, --cluster and the scheduler name the same cluster."""
        while True:
            try:
                identity = controller.check_identity(options["cluster"])
            except MisconfiguredController as exc:
                raise CommandError(f"not starting: {exc}") from None
            except (AdvisorAPIError, SchedulerError) as exc:
                self.stderr.write(f"{options['cluster']}: cannot check the cluster yet: {exc}")
                if options["once"]:
                    raise CommandError(str(exc)) from None
                time.sleep(options["interval"])
                continue
            self.stdout.write(
                f"controller {identity.actor} serves cluster {identity.cluster} "
                f"(Slurm ClusterName {identity.scheduler_cluster_name})"
            )
            return

    def _simulation(self, name: str, wait_seconds: float = 60.0) -> SimulationStore:
        """The running simulation of ``name``, waiting a while for it to start."""
        deadline = time.monotonic() + wait_seconds
        while True:
            try:
                return SimulationStore.published(settings.REDIS_URL, name)
            except SchedulerError as exc:
                if time.monotonic() > deadline:
                    raise CommandError(str(exc)) from None
            time.sleep(1.0)
