from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from recovery.choices import ClusterMode
from recovery.demo.live import DEMO_FAULTS_PER_JOB_HOUR, DEMO_SPEEDUP, LIVE_CLUSTERS
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
            url = f"http://{host}:{port}/"
            manage = [sys.executable, str(settings.BASE_DIR / "manage.py")]
            steps = (
                ["migrate", "--no-input"],
                ["create_demo_users"],
                ["seed_demo"],
                ["prepare_live_demo"],
            )
            for step in steps:
                result = subprocess.run([*manage, *step], env=env, check=False)
                if result.returncode != 0:
                    raise CommandError(f"'manage.py {' '.join(step)}' failed")
            # Polls often enough that the simulated failures are seen within seconds.
            env.setdefault("WR_POLL_SECONDS", "2")
            processes = stack.role_processes(host, port) + live_demo_processes(
                url, settings.VAR_DIR
            )
            code = stack.supervise(
                processes,
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


def live_demo_processes(url: str, var_dir: Path) -> list[stack.Process]:
    """One simulation per live cluster, and a controller for the one in action mode."""
    manage = [sys.executable, str(settings.BASE_DIR / "manage.py")]
    processes = []
    for live in LIVE_CLUSTERS:
        simulate = [
            *manage, "simulate", "--cluster", live.name, "--mode", live.mode,
            "--nodes", str(live.nodes), "--jobs", str(live.jobs), "--seed", str(live.seed),
            "--speedup", f"{DEMO_SPEEDUP:g}",
            "--faults-per-job-hour", f"{DEMO_FAULTS_PER_JOB_HOUR:g}", "--reset",
        ]  # fmt: skip
        processes.append(stack.Process(f"sim-{live.name}", simulate))
        if live.mode == ClusterMode.ACTION:
            token_file = var_dir / "demo" / f"{live.name}.token"
            controller = [
                *manage, "advisor_controller", "--cluster", live.name, "--simulated",
                "--url", url.rstrip("/"), "--token-file", str(token_file), "--interval", "1",
            ]  # fmt: skip
            processes.append(stack.Process(f"controller-{live.name}", controller))
    return processes
