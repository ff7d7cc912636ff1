"""MariaDB and Redis of the run's own, on free loopback ports, so that stopping them hurts no one.

The machine's shared services (3306, 6379) serve the test suite and other checkouts; a chaos run
stops and starts its database and broker hundreds of times, so it brings private ones: a
MariaDB data directory made by ``mariadb-install-db`` and a ``redis-server`` that keeps nothing
on disk, as production Redis is expected to be treated (its queues, locks and channel layer come
back empty).
"""

from __future__ import annotations

import abc
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from workload_recovery.stack import free_port


class ServiceError(RuntimeError):
    """A service could not be provided; the message says what was missing or what it printed."""


class Service(abc.ABC):
    """One server process: started, stopped (cleanly or killed) and started again on its port."""

    name = "service"

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.port = free_port()
        self.popen: subprocess.Popen[bytes] | None = None
        self.log = work_dir / f"{self.name}.log"

    @abc.abstractmethod
    def argv(self) -> list[str]:
        """The server's command line."""

    @abc.abstractmethod
    def ready(self) -> bool:
        """Whether the server answers now."""

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def start(self, wait_s: float = 60.0) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if not port_is_free(self.port):
            # Taken while this one was down (a test's own server on a free port, say): the
            # stranger would answer for it, and the run's processes would talk to it.
            raise ServiceError(
                f"{self.name}: port {self.port} was taken by another process while it was "
                "stopped; run make chaos alone"
            )
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + wait_s
        while not self.ready():
            if self.popen.poll() is not None:
                raise ServiceError(
                    f"{self.name} exited with {self.popen.returncode}: {self._log_tail()}"
                )
            if time.monotonic() > deadline:
                raise ServiceError(f"{self.name} did not answer within {wait_s:g} s")
            time.sleep(0.1)

    def stop(self, *, kill: bool = False, wait_s: float = 60.0) -> None:
        """SIGKILL (a crash) or SIGTERM (an orderly shutdown), and wait until it is gone."""
        if self.popen is None or self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.popen.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-1500:]
        except OSError:
            return "(no log)"


class PrivateMariaDB(Service):
    name = "mariadb"

    def __init__(self, work_dir: Path, database: str = "workload_recovery_chaos") -> None:
        super().__init__(work_dir)
        self.data_dir = work_dir / "data"
        self.database = database

    @property
    def url(self) -> str:
        return f"mysql://root@127.0.0.1:{self.port}/{self.database}"

    def install(self) -> None:
        binary = shutil.which("mariadb-install-db")
        if binary is None or shutil.which("mariadbd", path="/usr/sbin:/usr/bin") is None:
            raise ServiceError("MariaDB is not installed (Debian: apt-get install mariadb-server)")
        shutil.rmtree(self.data_dir, ignore_errors=True)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        # --no-defaults: the machine's my.cnf names its own user and data directory.
        result = subprocess.run(
            [
                binary, "--no-defaults", f"--datadir={self.data_dir}", f"--user={_user()}",
                "--auth-root-authentication-method=normal", "--skip-test-db",
                "--skip-name-resolve",
            ],
            capture_output=True,
            check=False,
        )  # fmt: skip
        if result.returncode != 0:
            output = (result.stdout + result.stderr).decode(errors="replace")[-1500:]
            raise ServiceError(f"mariadb-install-db failed: {output}")

    def argv(self) -> list[str]:
        binary = shutil.which("mariadbd", path="/usr/sbin:/usr/bin") or "/usr/sbin/mariadbd"
        return [
            binary, "--no-defaults", f"--datadir={self.data_dir}", f"--user={_user()}",
            f"--port={self.port}", "--bind-address=127.0.0.1",
            f"--socket={self.work_dir / 'mariadb.sock'}",
            f"--pid-file={self.work_dir / 'mariadb.pid'}", "--skip-name-resolve",
            "--max-connections=400", "--innodb-buffer-pool-size=128M",
        ]  # fmt: skip

    def ready(self) -> bool:
        result = subprocess.run(
            ["mysqladmin", "--no-defaults", "--protocol=tcp", "-h", "127.0.0.1",
             "-P", str(self.port), "-u", "root", "--connect-timeout=1", "ping"],
            capture_output=True,
            check=False,
        )  # fmt: skip
        return result.returncode == 0

    def create_database(self) -> None:
        subprocess.run(
            ["mysql", "--no-defaults", "--protocol=tcp", "-h", "127.0.0.1", "-P", str(self.port),
             "-u", "root", "-e",
             f"CREATE DATABASE IF NOT EXISTS {self.database} CHARACTER SET utf8mb4"],
            check=True,
        )  # fmt: skip


class PrivateRedis(Service):
    name = "redis"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def argv(self) -> list[str]:
        binary = shutil.which("redis-server")
        if binary is None:
            raise ServiceError(
                "redis-server is not installed (Debian: apt-get install redis-server)"
            )
        return [
            binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
            "--appendonly", "no", "--dir", str(self.work_dir),
        ]  # fmt: skip

    def ready(self) -> bool:
        from workload_recovery.stack import redis_answers

        return redis_answers(self.url, timeout_seconds=0.3)


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name
