"""``manage.py scheduler_check --cluster NAME [--json]``: what the system reads from a scheduler."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from recovery.clusters.scheduler_check import check_scheduler, format_check
from recovery.loop.poll import adapter_for
from recovery.models import Cluster
from recovery.schedulers.base import SchedulerError


class Command(BaseCommand):
    help = (
        "Read a cluster's scheduler the way the poller and the controller do, and show what "
        "they see: the Slurm version, how it is reached, each job (state, submit time, nodes, "
        "exclusions, restart count, opted in or why not), each node, and every field that "
        "could not be read, with the reason. Changes nothing. Exits 1 when something failed."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--cluster", required=True, metavar="NAME")
        parser.add_argument("--json", action="store_true", help="one JSON object on stdout")

    def handle(self, *args: Any, **options: Any) -> None:
        cluster = Cluster.objects.filter(name=options["cluster"]).first()
        if cluster is None:
            raise CommandError(f"no cluster is called {options['cluster']!r}")
        try:
            adapter = adapter_for(cluster)
        except SchedulerError as exc:
            raise CommandError(str(exc)) from None
        check = check_scheduler(cluster, adapter)
        if options["json"]:
            self.stdout.write(json.dumps(check.as_json(), indent=2))
        else:
            for line in format_check(check):
                self.stdout.write(line)
        if not check.ok:
            raise CommandError("; ".join(check.errors))
