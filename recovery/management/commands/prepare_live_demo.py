from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from recovery.demo.live import prepare_live_clusters


class Command(BaseCommand):
    help = "Create the demo's live simulated clusters, their policies and controller tokens."

    def handle(self, *args: Any, **options: Any) -> None:
        for live, token_file in prepare_live_clusters(settings.VAR_DIR):
            where = f", controller token in {token_file}" if token_file else ""
            self.stdout.write(f"{live.name}: {live.mode} mode{where}")
