"""Start and run times of the poll tasks, from Celery's own task events (``worker -E``).

As a monitor such as Flower reads them: nothing in the system is instrumented.
"""

from __future__ import annotations

import ast
import contextlib
import threading
from typing import Any

from bench.scaling.steps import PollTask

# Tasks a poll's snapshot queues, by the kind they are counted as.
QUEUED_BY_WORKERS = {
    "tasks.polling.process_workloads": "shard",
    "tasks.polling.judge_cluster": "judge",
}


class TaskEvents:
    """Start and finish of the poll tasks, from the worker's task events."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.tasks: dict[str, PollTask] = {}
        self.lock = threading.Lock()
        self.receiver: Any = None
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, name="celery-events", daemon=True)

    def start(self) -> None:
        self.thread.start()
        self.ready.wait(10)

    def stop(self) -> None:
        if self.receiver is not None:
            self.receiver.should_stop = True
        self.thread.join(5)

    def sent(self, task_id: str, at: float) -> None:
        with self.lock:
            self.tasks[task_id] = PollTask(sent=at)

    def _run(self) -> None:
        with self.app.connection_for_read() as connection:
            self.receiver = self.app.events.Receiver(connection, handlers={"*": self._on_event})
            # The worker starts after this and is pinged before any poll is sent, so the
            # receiver's queue is declared before the first task event.
            self.ready.set()
            self.receiver.capture(limit=None, timeout=None, wakeup=False)

    def _on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type", "")
        if not kind.startswith("task-"):
            return
        with self.lock:
            task = self.tasks.get(event.get("uuid", ""))
            queued_by_worker = QUEUED_BY_WORKERS.get(str(event.get("name")))
            if task is None and kind == "task-received" and queued_by_worker:
                # Queued by a snapshot's task, not by this process: known from its arrival.
                task = self.tasks[event["uuid"]] = PollTask(
                    sent=float(event["timestamp"]), kind=queued_by_worker
                )
            if task is None:
                return
            if kind == "task-started":
                task.started = float(event["timestamp"])
            elif kind == "task-succeeded":
                task.finished = float(event["timestamp"])
                task.runtime = float(event.get("runtime") or 0.0)
                with contextlib.suppress(ValueError, SyntaxError):
                    parsed = ast.literal_eval(event.get("result") or "{}")
                    if isinstance(parsed, dict):
                        task.result = parsed
            elif kind == "task-failed":
                task.finished, task.failed = float(event["timestamp"]), True
            elif kind == "task-revoked":
                task.expired = bool(event.get("expired"))
                task.finished = float(event["timestamp"])

    def snapshot(self) -> list[PollTask]:
        with self.lock:
            return [PollTask(**vars(task)) for task in self.tasks.values()]
