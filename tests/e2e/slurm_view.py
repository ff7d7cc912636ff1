"""Slurm, read directly: the harness's own view, independent of the code under test.

Commands go through the session's ``SlurmCluster`` (local for 22.05, the chroot for 24.11);
``Timeline`` records the job's and the nodes' state changes for the report.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import threading
import time
from typing import Any

from tests.slurm_fixtures import SlurmCluster


def slurm(
    cluster: SlurmCluster, *args: str, timeout: float = 30, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return cluster.run(list(args), timeout=timeout, env=env)


def job_fields(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    """``scontrol show job -o`` as a dict; the comment may hold spaces, so split on known keys."""
    shown = slurm(cluster, "scontrol", "show", "job", "-o", job_id)
    if shown.returncode != 0:
        return {}
    fields: dict[str, str] = {}
    for match in re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z:/]*)=(\S*)", shown.stdout):
        fields.setdefault(match.group(1), match.group(2))
    return fields


def node_states(cluster: SlurmCluster) -> dict[str, str]:
    listed = slurm(cluster, "sinfo", "-h", "-N", "-o", "%N %T")
    states: dict[str, str] = {}
    for line in listed.stdout.splitlines():
        name, _, state = line.partition(" ")
        states[name] = state.strip()
    return states


def expand_nodes(cluster: SlurmCluster, nodelist: str) -> list[str]:
    if not nodelist or nodelist == "(null)":
        return []
    shown = slurm(cluster, "scontrol", "show", "hostnames", nodelist)
    return shown.stdout.split()


class Timeline:
    """Changes of the job's and the nodes' states as Slurm reports them, with wall-clock times."""

    def __init__(self, cluster: SlurmCluster, job_id: str, started: float) -> None:
        self.cluster = cluster
        self.job_id = job_id
        self.started = started
        self.entries: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="e2e-timeline", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def note(self, what: str) -> None:
        self.entries.append({"t": round(time.time() - self.started, 2), "event": what})

    def _watch(self) -> None:
        last_job = ""
        last_nodes: dict[str, str] = {}
        while not self._stop.is_set():
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                fields = job_fields(self.cluster, self.job_id)
                job = " ".join(
                    f"{key}={fields.get(key, '')}"
                    for key in ("JobState", "Reason", "Restarts", "NodeList", "ExcNodeList")
                )
                if job != last_job:
                    self.note(f"job {job}")
                    last_job = job
                nodes = node_states(self.cluster)
                if not last_nodes:
                    self.note("nodes " + " ".join(f"{n}={s}" for n, s in sorted(nodes.items())))
                    last_nodes = dict(nodes)
                for name, state in sorted(nodes.items()):
                    if last_nodes.get(name) != state:
                        self.note(f"node {name} {state}")
                        last_nodes[name] = state
            self._stop.wait(0.5)
