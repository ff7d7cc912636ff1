"""The Console and the API while a load step runs, measured from outside as a user sees them.

A uvicorn server (``workload_recovery.stack.web_command``, DEBUG off) on the bench's database
and Redis; a logged-in HTTP client timing the fleet page and the workloads API every second;
a WebSocket on the fleet's live group, timing each audit event from its row's ``occurred_at``
(set when the event is made, just before its insert) to its arrival over the socket, for the
kinds stamped with the time they are recorded (a checkpoint's event carries the log line's time).
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.scaling.processes import Child, start_child, stop_child
from bench.scaling.steps import median, percentile

# The user bench-console's client logs in as (``bench.console.Browserless``).
USER = "bench"
STAMPED_WHEN_RECORDED = {"detected", "state_changed"}
PAGES = {
    "fleet page": "/",
    "fleet page, running": "/?state=running",
    "API: running workloads": "/api/v1/workloads/?state=running",
}


class ConsoleProbe:
    """Pages and live pushes while a step runs; ``stop`` returns their figures."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env = {**env, "DEBUG": "false"}
        self.log = log
        self.server: Child | None = None
        self.stopping = threading.Event()
        self.pages: dict[str, list[float]] = {name: [] for name in PAGES}
        self.pushes: list[float] = []
        self.errors: list[str] = []
        self.threads: list[threading.Thread] = []
        self.base = ""

    def start(self) -> None:
        from bench.console import Browserless, collect_static, wait_for_http
        from workload_recovery.stack import free_port, web_command

        collect_static()  # DEBUG off: the pages name their static files by the manifest
        _ensure_user()
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        self.server = start_child("web", web_command("127.0.0.1", port), self.log, self.env)
        wait_for_http(f"{self.base}/accounts/login/", self.server.popen)
        client = Browserless(self.base)
        client.login()
        cookie = "; ".join(f"{c.name}={c.value}" for c in client.jar)
        self.threads = [
            threading.Thread(target=self._pages, args=(client,), daemon=True, name="pages"),
            threading.Thread(target=self._socket, args=(port, cookie), daemon=True, name="ws"),
        ]
        for thread in self.threads:
            thread.start()

    def measuring(self) -> None:
        """The window starts: what was timed during the warm-up is dropped."""
        self.pages = {name: [] for name in PAGES}
        self.pushes = []

    def stop(self) -> dict[str, Any]:
        self.stopping.set()
        for thread in self.threads:
            thread.join(10)
        if self.server is not None:
            stop_child(self.server)
        figures: dict[str, Any] = {}
        for name, times in self.pages.items():
            figures[name] = _summary(times)
        figures["live push"] = _summary(self.pushes)
        if self.errors:
            figures["errors"] = self.errors[:5]
        return figures

    def _pages(self, client: Any) -> None:
        while not self.stopping.wait(1.0):
            for name, path in PAGES.items():
                try:
                    self.pages[name].append(client.timed_get(path))
                except (OSError, SystemExit) as error:
                    self.errors.append(f"{path}: {error}")

    def _socket(self, port: int, cookie: str) -> None:
        from websockets.exceptions import WebSocketException
        from websockets.sync.client import connect

        try:
            with connect(
                f"ws://127.0.0.1:{port}/ws/live/",
                additional_headers={"Cookie": cookie, "Origin": self.base},
                open_timeout=10,
            ) as socket:
                while not self.stopping.is_set():
                    try:
                        raw = socket.recv(timeout=0.5)
                    except TimeoutError:
                        continue
                    arrived = time.time()
                    message = json.loads(raw)
                    if message.get("kind") in STAMPED_WHEN_RECORDED:
                        made = datetime.fromisoformat(message["occurred_at"]).timestamp()
                        self.pushes.append((arrived - made) * 1000)
        except (OSError, WebSocketException) as error:
            self.errors.append(f"live socket: {error}")


def _summary(times: list[float]) -> dict[str, float | int | None]:
    return {
        "n": len(times),
        "median_ms": round(median(times), 1) if times else None,
        "p95_ms": round(percentile(times, 95), 1) if times else None,
    }


def _ensure_user() -> None:
    from django.contrib.auth.models import Group, User

    from bench.console import PASSWORD
    from recovery.roles import OPERATOR

    user, _ = User.objects.get_or_create(username=USER)
    user.set_password(PASSWORD)
    user.save()
    user.groups.add(Group.objects.get(name=OPERATOR))


def describe(figures: dict[str, Any]) -> str:
    parts = []
    for name, values in figures.items():
        if name == "errors" or not isinstance(values, dict) or not values.get("n"):
            continue
        parts.append(
            f"{name} {values['median_ms']:.0f} ms (p95 {values['p95_ms']:.0f}, n {values['n']})"
        )
    text = "; ".join(parts) or "nothing measured"
    if figures.get("errors"):
        text += f"; errors: {figures['errors']}"
    return text
