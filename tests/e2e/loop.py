"""The loop under test, run as in production but in the test process.

A thread polls the scenario's cluster every second (``poll_cluster``, and the watchdog), and
another runs the Advisor Controller, which claims and carries out recommendations through the
Advisor API of pytest-django's live server.
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
import time
import traceback
from collections.abc import Callable

from django.db import close_old_connections, connection

from recovery.controller.controller import AdvisorController
from recovery.loop.poll import poll_cluster
from recovery.models import Cluster

POLL_SECONDS = 1.0
CONTROLLER_SECONDS = 0.5


def _watchdog() -> Callable[[], object] | None:
    if importlib.util.find_spec("recovery.loop.watchdog") is None:
        return None
    return getattr(importlib.import_module("recovery.loop.watchdog"), "run_watchdog", None)


class Loop:
    """The poller (and watchdog) thread and, optionally, the Advisor Controller thread."""

    def __init__(self, cluster: Cluster, controller: AdvisorController | None) -> None:
        self.cluster_id = cluster.pk
        self.controller = controller
        self.errors: list[str] = []
        self.outcomes: list[tuple[float, int, str]] = []
        self.polls = 0
        self.watchdog = _watchdog()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._poll, name="e2e-poller", daemon=True)]
        if controller is not None:
            self._threads.append(
                threading.Thread(target=self._control, name="e2e-controller", daemon=True)
            )

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def _every(self, seconds: float, work: Callable[[], None]) -> None:
        try:
            while not self._stop.is_set():
                began = time.monotonic()
                try:
                    work()
                except Exception:
                    # Kept and shown by the test: a loop that raises is a finding.
                    self.errors.append(traceback.format_exc())
                    close_old_connections()
                self._stop.wait(max(0.0, seconds - (time.monotonic() - began)))
        finally:
            connection.close()

    def _poll(self) -> None:
        def once() -> None:
            cluster = Cluster.objects.get(pk=self.cluster_id)
            poll_cluster(cluster)
            self.polls += 1
            if self.watchdog is not None:
                self.watchdog()

        self._every(POLL_SECONDS, once)

    def _control(self) -> None:
        assert self.controller is not None
        controller = self.controller

        def once() -> None:
            for recommendation_id, outcome in controller.run_once():
                self.outcomes.append((time.time(), recommendation_id, outcome))

        self._every(CONTROLLER_SECONDS, once)
