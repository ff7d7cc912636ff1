"""``manage.py advisor_controller``: the Advisor Controller's run loop (recovery.controller.cli)
with the control plane's settings, for a host that has them; the options are the same."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from recovery.controller import cli


class Command(BaseCommand):
    help = cli.DESCRIPTION

    def add_arguments(self, parser: CommandParser) -> None:
        cli.add_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            cli.run(
                cli.ControllerOptions.from_parsed(options),
                redis_url=settings.REDIS_URL,
                out=self.stdout,
                err=self.stderr,
            )
        except cli.ControllerExit as exc:
            raise CommandError(str(exc)) from None
