from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from recovery.demo.fleet import DEMO_USERS
from recovery.demo.live import DEMO_FAULTS_PER_JOB_HOUR, DEMO_SPEEDUP, LIVE_CLUSTERS
from workload_recovery import stack

# The banner is repeated this often, at a moment the output has been quiet, so that it can be
# found again whatever scrolled past.
BANNER_EVERY_S = 180.0
# The children log warnings and errors only unless DEMO_LOG_LEVEL says otherwise: every task
# and request at INFO would bury the banner within seconds.
DEFAULT_DEMO_LOG_LEVEL = "WARNING"


class Command(BaseCommand):
    help = (
        "Prepare and run the demo: migrate, create the demo users, seed a demo cluster, then "
        "serve the Console with a worker, beat, the live simulations and their controllers "
        "until Ctrl-C. Uses a Redis database of its own on the server at REDIS_URL when it "
        "answers (emptied on exit), else starts a private redis-server."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))

    def handle(self, *args: Any, host: str, port: int, **options: Any) -> None:
        env = dict(os.environ)
        env.setdefault("DEBUG", "true")
        log_level = env.setdefault("DEMO_LOG_LEVEL", DEFAULT_DEMO_LOG_LEVEL).upper()
        env["LOG_LEVEL"] = log_level
        password = env.get("DEMO_PASSWORD") or secrets.token_urlsafe(12)
        env["DEMO_PASSWORD"] = password
        url = f"http://{host}:{port}/"
        banner = Banner(url, password, chosen=bool(os.environ.get("DEMO_PASSWORD")))
        helpers: list[stack.Process] = []
        own_database = ""
        code = 0
        try:
            redis_url = self._redis(helpers)
            if helpers == []:
                own_database = redis_url
            env["REDIS_URL"] = redis_url
            manage = [sys.executable, str(settings.BASE_DIR / "manage.py")]
            steps = (
                ["migrate", "--no-input", "--verbosity", "0"],
                ["create_demo_users", "--verbosity", "0"],
                ["seed_demo"],
                ["prepare_live_demo"],
            )
            for step in steps:
                result = subprocess.run([*manage, *step], env=env, check=False)
                if result.returncode != 0:
                    raise CommandError(f"'manage.py {' '.join(step)}' failed")
            # Polls often enough that the simulated failures are seen within seconds.
            env.setdefault("WR_POLL_SECONDS", "2")
            processes = stack.role_processes(host, port, log_level=log_level)
            processes += live_demo_processes(url, settings.VAR_DIR)
            code = stack.supervise(
                processes, env, while_running=lambda: banner.show_when_due(self.stdout.write)
            )
        finally:
            stack.stop_all(helpers)
            if own_database:
                left = stack.release_demo_database(own_database)
                self.stdout.write(
                    f"Emptied the demo's Redis database "
                    f"{stack.redis_url_for_display(own_database)} ({left} keys)."
                )
        if code:
            raise CommandError(f"a process exited with code {code}")

    def _redis(self, helpers: list[stack.Process]) -> str:
        """The demo's own Redis database: on the server at REDIS_URL if it answers, else private."""
        shared = settings.REDIS_URL
        if stack.redis_answers(shared):
            claimed = stack.claim_demo_database(shared)
            if claimed is not None:
                self.stdout.write(
                    f"Using Redis database {stack.redis_url_for_display(claimed)} (the demo's "
                    "own; emptied on exit)"
                )
                return claimed
            self.stdout.write(
                f"Every database of {stack.redis_url_for_display(shared)} is in use: "
                "starting a private Redis."
            )
        redis_url, redis_process = stack.start_local_redis(settings.VAR_DIR / "demo-redis")
        helpers.append(redis_process)
        self.stdout.write(f"Started a private Redis at {redis_url}")
        return redis_url


class Banner:
    """What to open, who to log in as, and what to try: shown once the Console answers, then
    again every few minutes, at a moment the children's output has been quiet."""

    def __init__(self, url: str, password: str, *, chosen: bool) -> None:
        self.url = url
        self.password = password
        self.chosen = chosen
        self.shown_at: float | None = None

    def text(self) -> str:
        login = f"{self.url}accounts/login/"
        where_from = "from DEMO_PASSWORD" if self.chosen else "set DEMO_PASSWORD to choose it"
        users = ", ".join(name for name, _, _ in DEMO_USERS)
        return "\n".join(
            [
                "",
                "=" * 78,
                f"Workload Recovery demo: open {login}",
                f"  User names: {users} (one password for all three)",
                "    operator  may approve and reject recommendations",
                "    viewer    reads everything, decides nothing",
                f"    admin     Django admin at {self.url}admin/ (policies, detection patterns)",
                f"  Password:   {self.password}   ({where_from})",
                "  Try:",
                "    Approvals: approve a recommendation on live-monitor; its controller",
                "      restarts the job within seconds (Fleet, cluster live-monitor).",
                "    Fleet, cluster live-action: failures are restarted on their own,",
                "      excluding the nodes that failed.",
                "    demo-a100, demo-h100: recorded history to browse.",
                "  Ctrl-C stops everything.",
                "=" * 78,
                "",
            ]
        )

    def show_when_due(self, write: Callable[[str], Any]) -> None:
        now = time.monotonic()
        if self.shown_at is None:
            if not _answers(self.url):
                return
        elif now - self.shown_at < BANNER_EVERY_S:
            return
        write(self.text())
        self.shown_at = now


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}accounts/login/", timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def live_demo_processes(url: str, var_dir: Path) -> list[stack.Process]:
    """One simulation and one controller per live cluster: in monitor mode the controller
    carries out what an operator approves, in action mode what the policy decides."""
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
        token_file = var_dir / "demo" / f"{live.name}.token"
        controller = [
            *manage, "advisor_controller", "--cluster", live.name, "--simulated",
            "--url", url.rstrip("/"), "--token-file", str(token_file), "--interval", "1",
        ]  # fmt: skip
        processes.append(stack.Process(f"controller-{live.name}", controller))
    return processes
