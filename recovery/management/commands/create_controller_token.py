from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import IntegrityError

from recovery.models import Cluster, ControllerToken


class Command(BaseCommand):
    help = "Issue a controller token for one cluster; the key is printed once and not stored."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--cluster", required=True)
        parser.add_argument("--name", required=True, help="e.g. slurm-advisor-1")

    def handle(self, *args: Any, cluster: str, name: str, **options: Any) -> None:
        try:
            target = Cluster.objects.get(name=cluster)
        except Cluster.DoesNotExist:
            raise CommandError(f"no cluster named {cluster!r}") from None
        try:
            _, key = ControllerToken.issue(target, name)
        except IntegrityError:
            raise CommandError(f"cluster {cluster} already has a token named {name!r}") from None
        self.stdout.write(key)
