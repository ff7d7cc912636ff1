"""The processes a run starts (stopped on any exit) and the CPU every role uses, from /proc."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench.scaling.steps import ROOT

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Child:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path


def start_child(name: str, argv: list[str], log: Path, env: dict[str, str]) -> Child:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        # Its own process group: a stop reaches celery's pool processes too, and Ctrl-C is
        # handled here once rather than by every child.
        popen = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Child(name, popen, log)


def stop_child(child: Child, grace_s: float = 20.0) -> None:
    if child.popen.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.popen.pid, signal.SIGTERM)
    try:
        child.popen.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.popen.pid, signal.SIGKILL)
        child.popen.wait()


class Children:
    """Every process this run started, so that any exit (Ctrl-C included) stops them."""

    def __init__(self) -> None:
        self.running: list[Child] = []

    def start(self, name: str, argv: list[str], log: Path, env: dict[str, str]) -> Child:
        child = start_child(name, argv, log, env)
        self.running.append(child)
        return child

    def stop(self, child: Child) -> None:
        stop_child(child)
        if child in self.running:
            self.running.remove(child)

    def stop_all(self) -> None:
        for child in reversed(self.running):
            stop_child(child)
        self.running.clear()

    def check(self) -> None:
        for child in self.running:
            if child.popen.poll() is not None:
                tail = child.log.read_text(errors="replace")[-2000:]
                raise SystemExit(f"{child.name} exited with {child.popen.returncode}:\n{tail}")


# ---------------------------------------------------------------------------- CPU from /proc


def _proc_stat(pid: int) -> tuple[int, int] | None:
    """(process group, CPU ticks used) of a process, or None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = text.rsplit(")", 1)[1].split()
    return int(rest[2]), int(rest[11]) + int(rest[12])


def _pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def pids_named(*names: str) -> list[int]:
    found = []
    for pid in _pids():
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() in names:
                found.append(pid)
    return found


def cpu_ticks(groups: dict[str, list[int]], services: dict[str, list[int]]) -> dict[str, int]:
    """CPU ticks so far per role: its children's whole process groups, or a service's processes.

    User and system time only: a process waiting on MariaDB, Redis or a file spends none.
    """
    totals = dict.fromkeys([*groups, *services], 0)
    by_group = {pgid: role for role, pgids in groups.items() for pgid in pgids}
    for pid in _pids():
        stat = _proc_stat(pid)
        if stat is not None and stat[0] in by_group:
            totals[by_group[stat[0]]] += stat[1]
    for role, pids in services.items():
        for pid in pids:
            stat = _proc_stat(pid)
            if stat is not None:
                totals[role] += stat[1]
    return totals


def machine_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine: other tenants show up here."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)
