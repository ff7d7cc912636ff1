"""Run web, worker and beat together in the foreground, and stop all of them together.

Used by ``manage.py run_stack`` and ``manage.py demo``. In production each role runs as its
own service (see deploy/Procfile); this is for a laptop or a single small host.

The supervisor is ours rather than honcho's (2.0.0) because a stop must always end every child:
honcho's manager raises from its signal handler on a Ctrl-C that comes before every process has
reported its pid, then waits forever on children it no longer signals; and it sends SIGKILL only
once some child has exited, so children that all ignore SIGTERM are never stopped. Ours escalates
to SIGKILL after a grace period in every case. The demo's processes are also built here (the
venv's interpreter, loopback only, one simulation per live cluster), not read from the Procfile.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import redis

logger = logging.getLogger(__name__)


class StackError(RuntimeError):
    """Something the stack needs is missing; the message says what."""


@dataclass
class Process:
    name: str
    argv: list[str]
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)


def redis_answers(url: str, timeout_seconds: float = 1.0) -> bool:
    client = redis.Redis.from_url(
        url, socket_connect_timeout=timeout_seconds, socket_timeout=timeout_seconds
    )
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_local_redis(work_dir: Path) -> tuple[str, Process]:
    """Start a private redis-server on a free loopback port, keeping nothing on disk."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise StackError(
            "No Redis answers and redis-server is not installed "
            "(Debian: apt-get install redis-server), or set REDIS_URL."
        )
    work_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    process = Process(
        "redis",
        [
            binary,
            "--bind", "127.0.0.1",
            "--port", str(port),
            "--save", "",
            "--appendonly", "no",
            "--dir", str(work_dir),
        ],
    )  # fmt: skip
    start(process)
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + 10
    while not redis_answers(url, 0.2):
        if process.popen is not None and process.popen.poll() is not None:
            raise StackError(f"redis-server exited with code {process.popen.returncode}")
        if time.monotonic() > deadline:
            raise StackError("redis-server did not answer within 10 s")
        time.sleep(0.1)
    return url, process


def web_command(host: str, port: int, python: str = sys.executable) -> list[str]:
    """The ASGI server (HTTP and WebSocket), as every stack and deploy/Procfile run it.

    uvicorn hands a request body to the application as it arrives and stops reading while the
    application does not take it (its flow control is left at its defaults), so the body limit
    in front of the API can answer before a large body is read; daphne reads every body whole
    first. h11 and the websockets library are the pinned implementations. Channels has no
    lifespan handler, proxy headers stay off as they were under daphne (a client on loopback
    could otherwise choose its own address; Django reads X-Forwarded-Proto where
    SECURE_PROXY_SSL_HEADER says so), and a stop waits at most 5 s for open requests and sockets.
    """
    return [
        python, "-m", "uvicorn", "workload_recovery.asgi:application",
        "--host", host, "--port", str(port),
        "--http", "h11", "--ws", "websockets-sansio",
        "--lifespan", "off", "--no-proxy-headers",
        "--timeout-graceful-shutdown", "5",
    ]  # fmt: skip


def role_processes(
    host: str, port: int, *, concurrency: int = 2, log_level: str = "INFO"
) -> list[Process]:
    python = sys.executable
    bin_dir = Path(python).parent
    celery = str(bin_dir / "celery")
    return [
        Process("web", [*web_command(host, port, python), "--log-level", log_level.lower()]),
        Process(
            "worker",
            [celery, "-A", "tasks", "worker", "--loglevel", log_level,
             "--concurrency", str(concurrency), "-n", f"worker-{os.getpid()}@%h"],
        ),
        Process("beat", [celery, "-A", "tasks", "beat", "--loglevel", log_level]),
    ]  # fmt: skip


def start(process: Process, env: dict[str, str] | None = None) -> None:
    # Each child leads its own process group so a stop reaches its children too
    # (celery's pool processes), and so Ctrl-C is handled here once, not in every child.
    process.popen = subprocess.Popen(process.argv, env=env, start_new_session=True)


def stop_all(processes: list[Process], grace_seconds: float = 10.0) -> None:
    running = [p for p in processes if p.popen is not None and p.popen.poll() is None]
    for process in running:
        _signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    for process in running:
        assert process.popen is not None
        try:
            process.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.popen.wait()


def _signal_group(process: Process, signum: int) -> None:
    assert process.popen is not None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.popen.pid, signum)


def supervise(
    processes: list[Process],
    env: dict[str, str],
    *,
    on_started: Callable[[], None] | None = None,
    while_running: Callable[[], None] | None = None,
) -> int:
    """Start the processes and wait; stop them all on SIGINT/SIGTERM or when one exits.

    ``while_running`` is called about every half second while all of them run.
    """
    stopping = False

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    previous = {
        signum: signal.signal(signum, request_stop) for signum in (signal.SIGINT, signal.SIGTERM)
    }
    exit_code = 0
    try:
        for process in processes:
            start(process, env)
        if on_started is not None:
            on_started()
        while not stopping:
            for process in processes:
                assert process.popen is not None
                code = process.popen.poll()
                if code is not None:
                    exit_code = code or 1
                    stopping = True
                    break
            if not stopping and while_running is not None:
                while_running()
            time.sleep(0.5)
    finally:
        stop_all(processes)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return exit_code


# The key that marks a Redis database as the demo's own, holding the pid of the demo using it.
DEMO_DATABASE_MARKER = "wr-demo:owner"


def claim_demo_database(url: str) -> str | None:
    """A database of the Redis server at ``url`` for the demo alone, or None when none is free.

    The demo's keys (queues, channel groups, the simulations) must not mix with what else uses
    that server, and must all go when it stops. Taken from the highest-numbered database down
    (applications use the low ones): the first that is empty, or marked as the demo's by one
    that is no longer running. The marker is set at once; ``release_demo_database`` empties it.
    """
    parts = urlsplit(url)
    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
    try:
        databases = int(client.config_get("databases").get("databases") or 16)
    except (redis.RedisError, ValueError, TypeError):
        databases = 16  # CONFIG may be disabled; 16 is the server's default
    finally:
        client.close()
    for number in range(databases - 1, 0, -1):
        candidate = urlunsplit(parts._replace(path=f"/{number}"))
        database = redis.Redis.from_url(candidate, socket_connect_timeout=1, socket_timeout=1)
        try:
            owner = database.get(DEMO_DATABASE_MARKER)
            if owner is not None and _running(int(owner)):
                continue
            if owner is None and database.dbsize():
                continue
            database.flushdb()
            database.set(DEMO_DATABASE_MARKER, os.getpid())
            return candidate
        except (redis.RedisError, ValueError):
            continue
        finally:
            database.close()
    return None


def release_demo_database(url: str) -> int:
    """Empty the demo's database; returns how many keys it held."""
    database = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2)
    try:
        held = int(database.dbsize())
        database.flushdb()
        return held
    finally:
        database.close()


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def redis_url_for_display(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}{parts.path}"
