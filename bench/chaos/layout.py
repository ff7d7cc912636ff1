"""The production process layout on loopback, for the campaigns that run it (chaos, soak).

uvicorn, Celery workers, beat, one simulated clock per cluster and Advisor Controllers over the
Advisor API, each in its own process under a ``Supervisor``, against a MariaDB and a Redis of
the run's own on free ports (``bench.chaos.services``). A campaign subclasses ``LayoutRun``,
names itself (its database, its workers' names, its secret) and adds what it does with them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from bench.chaos.roles import Role, Supervisor
from bench.chaos.services import PrivateMariaDB, PrivateRedis
from workload_recovery.stack import free_port

ROOT = Path(__file__).resolve().parents[2]


class LayoutOptions(Protocol):
    @property
    def seed(self) -> int: ...
    @property
    def label(self) -> str: ...
    @property
    def poll_s(self) -> int: ...
    @property
    def workers(self) -> int: ...
    @property
    def lease_s(self) -> int: ...


class LayoutRun:
    """The services and the processes of one run, in ``<work root>/<label>-seed-<seed>``."""

    campaign = "layout"  # names the database, the workers and the secret
    lease_sweep_s = 3

    def __init__(self, options: LayoutOptions, work_root: Path) -> None:
        self.work = work_root / f"{options.label}-seed-{options.seed}"
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True)
        self.state_dir = self.work / "sim-state"
        self.db = PrivateMariaDB(self.work / "mariadb", f"workload_recovery_{self.campaign}")
        self.redis = PrivateRedis(self.work / "redis")
        self.web_port = free_port()
        self.url = f"http://127.0.0.1:{self.web_port}"
        self.supervisor = Supervisor(self.work)
        self.layout_options = options

    def env(self) -> dict[str, str]:
        options = self.layout_options
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "DJANGO_SETTINGS_MODULE": "workload_recovery.settings",
            "DATABASE_URL": self.db.url,
            "REDIS_URL": self.redis.url,
            "WR_VAR_DIR": str(self.work / "var"),
            "WR_SIMULATOR_STATE_DIR": str(self.state_dir),
            "WR_POLL_SECONDS": str(options.poll_s),
            "WR_WATCHDOG_SECONDS": "5",
            "WR_LEASE_SWEEP_SECONDS": str(self.lease_sweep_s),
            "WR_CACHE_DIR": str(ROOT / "var" / "cache"),
            "SECRET_KEY": f"{self.campaign}-{options.seed}-not-a-secret-of-any-site",
            "LOG_LEVEL": "WARNING",
        }

    def start_services(self) -> None:
        """The database and the broker, and Django in this process set up on them, migrated."""
        self.db.install()
        self.db.start()
        self.db.create_database()
        self.redis.start()
        os.environ.update(self.env())
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", interactive=False, verbosity=0)

    def add_platform_roles(self) -> None:
        from workload_recovery.stack import web_command

        python = sys.executable
        celery = str(Path(python).parent / "celery")
        env = self.env()
        self.supervisor.add("web", "web", web_command("127.0.0.1", self.web_port, python), env)
        for number in range(1, self.layout_options.workers + 1):
            self.supervisor.add(
                f"worker-{number}",
                "worker",
                [celery, "-A", "tasks", "worker", "--loglevel", "WARNING", "--concurrency", "2",
                 "-n", f"{self.campaign}-{number}@%h", "--without-mingle", "--without-gossip"],
                env,
            )  # fmt: skip
        self.supervisor.add(
            "beat", "beat", [celery, "-A", "tasks", "beat", "--loglevel", "WARNING"], env
        )

    def add_clock(self, role: str, cluster: str, *extra: str) -> Role:
        clock = [sys.executable, "-m", "bench.chaos.clock", "--cluster", cluster,
                 "--state-dir", str(self.state_dir), *extra]  # fmt: skip
        return self.supervisor.add(role, "clock", clock, self.env())

    def add_controller(
        self, role: str, cluster: str, token_file: Path, env: dict[str, str] | None = None
    ) -> Role:
        controller = [
            sys.executable, "-m", "recovery.controller.cli", "--cluster", cluster, "--simulated",
            "--url", self.url, "--token-file", str(token_file), "--interval", "1",
            "--lease-seconds", str(self.layout_options.lease_s),
        ]  # fmt: skip
        return self.supervisor.add(
            role, "controller", controller, {**self.env(), "WR_SIM_CALLER": role, **(env or {})}
        )

    def wait_for_web(self, seconds: float = 90.0) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.supervisor.tick()
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{self.url}/api/v1/health/", timeout=2),
            ):
                return
            time.sleep(0.3)
        raise SystemExit(f"the web process did not answer within {seconds:g} s")


@contextlib.contextmanager
def finished_run_database(work: Path, campaign: str) -> Iterator[None]:
    """The database a finished run left in ``work``, started again with Django set up on it."""
    db = PrivateMariaDB(work / "mariadb", f"workload_recovery_{campaign}")
    db.start()
    try:
        os.environ.update(
            {
                "DATABASE_URL": db.url,
                "DJANGO_SETTINGS_MODULE": "workload_recovery.settings",
                "WR_VAR_DIR": str(work / "var"),
            }
        )
        import django

        django.setup()
        yield
    finally:
        db.stop()


def write_report(work_root: Path, report: dict[str, Any], label: str, seed: int) -> None:
    """``report.json`` and ``report-<label>-seed-<seed>.json`` in ``work_root``."""
    work_root.mkdir(parents=True, exist_ok=True)
    text = json.dumps(report, indent=2, default=str)
    (work_root / "report.json").write_text(text)
    (work_root / f"report-{label}-seed-{seed}.json").write_text(text)


def rechecked(report_path: Path, recheck: Any) -> dict[str, Any]:
    """The checks run again on what a finished run left; its report rewritten with them."""
    report: dict[str, Any] = recheck(report_path)
    report_path.write_text(json.dumps(report, indent=2, default=str))
    return report
