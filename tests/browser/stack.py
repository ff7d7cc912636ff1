"""A real Console stack for the browser tests: private Redis, uvicorn and a Celery worker.

Every process runs against the pytest-django test database and leads its own process group, so
stopping one stops its children too. The stack has its own Redis on a free loopback port (the
channel layer and the Celery broker), which a test may stop and start again on the same port.
Logs go to var/browser/logs/ (git-ignored); ``tail_since`` shows what a failing test caused.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from celery import Celery

from workload_recovery.stack import free_port, redis_answers, web_command

CELERY_QUEUE = "browser-tests"
CHANNEL_PREFIX = "wr-browser"
WORKER_NAME = "browser-worker@localhost"


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_pytest() -> None:
    """In the child before exec: get SIGTERM when pytest dies, even by SIGKILL; no orphans."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class StackFailed(RuntimeError):
    """A process of the stack did not start; the message carries the end of its log."""


@dataclass
class StackProcess:
    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    log_file: IO[bytes] | None = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


@dataclass
class BrowserStack:
    """Start with ``start()``, stop with ``stop()``; ``base_url`` is the Console."""

    base_dir: Path
    database_url: str
    work_dir: Path
    redis_port: int = field(default_factory=free_port)
    web_port: int = field(default_factory=free_port)
    secret_key: str = field(default_factory=lambda: secrets.token_urlsafe(50))
    processes: dict[str, StackProcess] = field(default_factory=dict)
    _client: Celery | None = field(default=None, repr=False)

    # ---------- addresses ----------

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def log_dir(self) -> Path:
        return self.work_dir / "logs"

    @property
    def env(self) -> dict[str, str]:
        env = {
            key: value
            for key, value in os.environ.items()
            # The stack's settings come from here only, never from the caller's shell.
            if key
            not in {
                "DEBUG",
                "CELERY_BROKER_URL",
                "CELERY_RESULT_BACKEND",
                # The tests' own escape hatch (see conftest.py); the servers keep Django's guard.
                "DJANGO_ALLOW_ASYNC_UNSAFE",
            }
            and not key.startswith(("SECRET_KEY", "WR_", "PYTEST_"))
        }
        env.update(
            {
                "DJANGO_SETTINGS_MODULE": "workload_recovery.settings",
                "DATABASE_URL": self.database_url,
                "REDIS_URL": self.redis_url,
                "SECRET_KEY": self.secret_key,
                # Static files collected into the stack's own folder, served by WhiteNoise with
                # the production (manifest) storage, as deployed.
                "WR_VAR_DIR": str(self.work_dir / "var"),
                "WR_CELERY_QUEUE": CELERY_QUEUE,
                "WR_CHANNEL_PREFIX": CHANNEL_PREFIX,
                "PYTHONUNBUFFERED": "1",
                "LOG_LEVEL": "INFO",
            }
        )
        return env

    # ---------- the whole stack ----------

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for old in self.log_dir.glob("*.log"):
            old.unlink()
        self._collectstatic()
        self.start_redis()
        self.start_web()
        self.start_worker()
        self.wait_worker_ready(timeout=60)

    def stop(self) -> None:
        for name in ("worker", "web", "redis"):
            self._stop(name)
        if self._client is not None:
            self._client.close()
            self._client = None

    # ---------- Redis ----------

    def start_redis(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise StackFailed(
                "redis-server is not installed (Debian: apt-get install redis-server)"
            )
        self._spawn(
            "redis",
            [
                binary,
                "--port", str(self.redis_port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--daemonize", "no",
                "--dir", str(self.work_dir),
            ],
        )  # fmt: skip
        self._wait("redis", lambda: redis_answers(self.redis_url, 0.2), timeout=10)

    def stop_redis(self) -> None:
        self._stop("redis")

    # ---------- the ASGI server ----------

    def start_web(self) -> None:
        python = str(self.base_dir / ".venv" / "bin" / "python")
        self._spawn("web", web_command("127.0.0.1", self.web_port, python))
        self._wait("web", self._web_answers, timeout=30)

    def kill_web(self) -> None:
        """Stop the ASGI server at once, as a crash or a cut network would: no goodbyes."""
        self._stop("web", signum=signal.SIGKILL)

    def _web_answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/accounts/login/", timeout=2) as reply:
                status: int = reply.status
                return status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    # ---------- the Celery worker ----------

    def start_worker(self) -> None:
        celery = str(self.base_dir / ".venv" / "bin" / "celery")
        self._spawn(
            "worker",
            [
                celery, "-A", "tasks", "worker",
                "--pool", "solo",
                "--queues", f"{CELERY_QUEUE},{CELERY_QUEUE}.workloads",
                "--hostname", WORKER_NAME,
                "--without-gossip", "--without-mingle", "--without-heartbeat",
                "--loglevel", "INFO",
            ],
        )  # fmt: skip

    @property
    def celery(self) -> Celery:
        """A Celery client on the stack's broker: sends tasks by name to the real worker."""
        if self._client is None:
            # Not the current app: shared tasks elsewhere in the session must keep sending to
            # the project's broker, not to this stack's Redis (stopped after these tests).
            client = Celery(
                "browser-tests",
                broker=self.redis_url,
                backend=self.redis_url,
                set_as_current=False,
            )
            client.conf.update(
                task_default_queue=CELERY_QUEUE,
                broker_connection_retry_on_startup=True,
                result_expires=600,
            )
            self._client = client
        return self._client

    def run_task(self, name: str, timeout: float = 30) -> object:
        """Send the task through the broker and wait for the worker's result."""
        result = self.celery.send_task(name, queue=CELERY_QUEUE)
        return result.get(timeout=timeout)

    def wait_worker_ready(self, timeout: float = 60) -> None:
        """A real round trip: a task through the broker, run on the test database, result back."""
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            self._check_alive("worker")
            try:
                self.run_task("tasks.maintenance.release_expired_leases", timeout=5)
                return
            except Exception as exc:  # not connected yet: broker or worker still starting
                last_error = exc
                time.sleep(0.5)
        raise StackFailed(
            f"the Celery worker did not run a task within {timeout} s ({last_error!r})\n"
            + self.tail("worker")
        )

    # ---------- logs ----------

    def log_sizes(self) -> dict[str, int]:
        return {
            name: process.log_path.stat().st_size if process.log_path.exists() else 0
            for name, process in self.processes.items()
        }

    def tail_since(self, sizes: dict[str, int], limit: int = 6000) -> str:
        parts = []
        for name, process in self.processes.items():
            if not process.log_path.exists():
                continue
            with process.log_path.open("rb") as handle:
                handle.seek(sizes.get(name, 0))
                text = handle.read().decode(errors="replace")
            if text.strip():
                parts.append(f"----- {name} ({process.log_path}) -----\n{text[-limit:]}")
        return "\n".join(parts)

    def tail(self, name: str, limit: int = 6000) -> str:
        process = self.processes.get(name)
        if process is None or not process.log_path.exists():
            return f"(no log for {name})"
        text = process.log_path.read_bytes().decode(errors="replace")
        return f"----- {name} ({process.log_path}) -----\n{text[-limit:]}"

    # ---------- process handling ----------

    def _collectstatic(self) -> None:
        log_path = self.log_dir / "collectstatic.log"
        with log_path.open("wb") as log:
            done = subprocess.run(
                [str(self.base_dir / ".venv" / "bin" / "python"), "manage.py", "collectstatic",
                 "--noinput", "--clear", "-v", "1"],
                cwd=self.base_dir, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                timeout=120, check=False,
            )  # fmt: skip
        if done.returncode != 0:
            raise StackFailed(f"collectstatic failed:\n{log_path.read_text()[-4000:]}")

    def _spawn(self, name: str, argv: list[str]) -> None:
        if name in self.processes and self.processes[name].running:
            raise StackFailed(f"{name} is already running")
        log_path = self.log_dir / f"{name}.log"
        log_file = log_path.open("ab")
        log_file.write(f"\n=== starting {name}: {' '.join(argv)}\n".encode())
        log_file.flush()
        popen = subprocess.Popen(
            argv,
            cwd=self.base_dir,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_pytest,
        )
        self.processes[name] = StackProcess(name, argv, log_path, popen, log_file)

    def _check_alive(self, name: str) -> None:
        process = self.processes[name]
        if not process.running:
            code = process.popen.returncode if process.popen is not None else None
            raise StackFailed(f"{name} exited with code {code}\n{self.tail(name)}")

    def _wait(self, name: str, ready: object, timeout: float) -> None:
        assert callable(ready)
        deadline = time.monotonic() + timeout
        while not ready():
            self._check_alive(name)
            if time.monotonic() > deadline:
                raise StackFailed(f"{name} was not ready within {timeout} s\n{self.tail(name)}")
            time.sleep(0.1)

    def _stop(self, name: str, signum: int = signal.SIGTERM, grace: float = 10) -> None:
        process = self.processes.get(name)
        if process is None or process.popen is None:
            return
        popen = process.popen
        if popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signum)
            try:
                popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(popen.pid, signal.SIGKILL)
                popen.wait()
        # Children left in the group (a pool process) go too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(popen.pid, signal.SIGKILL)
        process.popen = None  # stopped: a second stop sends nothing to a reused process id
        if process.log_file is not None:
            process.log_file.close()
            process.log_file = None
