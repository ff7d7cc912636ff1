"""Write the demo clusters demo-a100 and demo-h100 with workloads, findings and trails."""

from __future__ import annotations

import logging
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from recovery.audit import live
from recovery.demo.fleet import A100_CLUSTER, H100_CLUSTER, seed_demo_cluster


class _CountUndelivered(logging.Filter):
    """Counts the live-update warnings instead of printing one traceback per event."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            self.count += 1
            return False
        return True


class Command(BaseCommand):
    help = (
        "Seed two simulated Slurm clusters (demo-a100 in monitor mode, demo-h100 in action "
        "mode) with workloads, anomalies, recommendations and their audit trail. Idempotent: "
        "running it again creates nothing new."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--seed", type=int, default=7, help="Seed for the small variations (default 7)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        undelivered = _CountUndelivered()
        live.logger.addFilter(undelivered)
        try:
            summary = seed_demo_cluster(seed=options["seed"])
        finally:
            live.logger.removeFilter(undelivered)
        counts = ", ".join(f"{count} {name}" for name, count in summary.as_dict().items())
        if summary.total:
            self.stdout.write(
                self.style.SUCCESS(f"Seeded {A100_CLUSTER} and {H100_CLUSTER}: created {counts}.")
            )
        else:
            self.stdout.write(
                f"{A100_CLUSTER} and {H100_CLUSTER} are already seeded; nothing created."
            )
        if undelivered.count:
            self.stdout.write(
                self.style.WARNING(
                    f"{undelivered.count} live updates were not delivered (channel layer not "
                    "reachable); the data is stored and shows when a Console page loads."
                )
            )
