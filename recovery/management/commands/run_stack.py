from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from workload_recovery import stack


class Command(BaseCommand):
    help = "Run web (uvicorn), a Celery worker and Celery beat together until Ctrl-C."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--concurrency", type=int, default=2)

    def handle(self, *args: Any, host: str, port: int, concurrency: int, **options: Any) -> None:
        if not stack.redis_answers(settings.REDIS_URL):
            raise CommandError(
                f"Redis does not answer at {stack.redis_url_for_display(settings.REDIS_URL)}; "
                "start it or set REDIS_URL (manage.py demo starts a private one)."
            )
        processes = stack.role_processes(host, port, concurrency=concurrency)
        code = stack.supervise(
            processes,
            dict(os.environ),
            on_started=lambda: self.stdout.write(f"Serving on http://{host}:{port}/"),
        )
        if code:
            raise CommandError(f"a process exited with code {code}")
