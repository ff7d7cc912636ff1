from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from workload_recovery import stack


class Command(BaseCommand):
    help = (
        "Prepare and run the demo: migrate, create the demo users, seed a demo cluster, then "
        "serve the Console with a worker and beat until Ctrl-C. Uses Redis at REDIS_URL when it "
        "answers, else starts a private redis-server."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))

    def handle(self, *args: Any, host: str, port: int, **options: Any) -> None:
        env = dict(os.environ)
        env.setdefault("DEBUG", "true")
        helpers: list[stack.Process] = []
        redis_url = settings.REDIS_URL
        try:
            if stack.redis_answers(redis_url):
                self.stdout.write(f"Using Redis at {stack.redis_url_for_display(redis_url)}")
            else:
                redis_url, redis_process = stack.start_local_redis(settings.VAR_DIR / "demo-redis")
                helpers.append(redis_process)
                self.stdout.write(f"Started a private Redis at {redis_url}")
            env["REDIS_URL"] = redis_url
            manage = [sys.executable, str(settings.BASE_DIR / "manage.py")]
            for step in (["migrate", "--no-input"], ["create_demo_users"], ["seed_demo"]):
                result = subprocess.run([*manage, *step], env=env, check=False)
                if result.returncode != 0:
                    raise CommandError(f"'manage.py {' '.join(step)}' failed")
            url = f"http://{host}:{port}/"
            code = stack.supervise(
                stack.role_processes(host, port),
                env,
                on_started=lambda: self.stdout.write(
                    self.style.SUCCESS(
                        f"\nWorkload Recovery demo: {url}  (log in at {url}accounts/login/)\n"
                        "Press Ctrl-C to stop everything.\n"
                    )
                ),
            )
        finally:
            stack.stop_all(helpers)
        if code:
            raise CommandError(f"a process exited with code {code}")
