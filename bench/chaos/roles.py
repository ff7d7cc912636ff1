"""The production process layout, each process restarted after it dies, and what happened to each.

Every role runs in its own process group (a kill reaches a Celery worker's pool too). A process
that exits, because the schedule killed it or for any reason of its own, is started again after
a delay; exits the schedule did not cause are kept with the tail of the process's log, because
each one is a finding.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Role:
    name: str
    kind: str  # web, worker, beat, controller, clock, approver
    argv: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    restart_at: float | None = None
    paused_until: float | None = None
    starts: int = 0
    expected_exit: bool = False

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


@dataclass
class Exit:
    role: str
    at: float
    code: int | None
    expected: bool
    log_tail: str = ""


@dataclass
class Supervisor:
    root: Path
    roles: list[Role] = field(default_factory=list)
    exits: list[Exit] = field(default_factory=list)
    restart_delay_s: float = 1.0

    def add(self, name: str, kind: str, argv: list[str], env: dict[str, str]) -> Role:
        role = Role(name, kind, argv, env, self.root / "logs" / f"{name}.log")
        self.roles.append(role)
        return role

    def of_kind(self, kind: str) -> list[Role]:
        return [role for role in self.roles if role.kind == kind]

    def start(self, role: Role) -> None:
        role.log.parent.mkdir(parents=True, exist_ok=True)
        with role.log.open("ab") as out:
            out.write(f"\n==== start {role.starts + 1} at {time.time():.3f}\n".encode())
            out.flush()
            role.popen = subprocess.Popen(
                role.argv,
                cwd=self.root_of_project(),
                env=role.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        role.starts += 1
        role.restart_at = None
        role.paused_until = None
        role.expected_exit = False

    @staticmethod
    def root_of_project() -> Path:
        return Path(__file__).resolve().parents[2]

    def start_all(self) -> None:
        for role in self.roles:
            self.start(role)

    def kill(self, role: Role, restart_in_s: float) -> bool:
        """SIGKILL the role's process group; it starts again after ``restart_in_s``."""
        if not role.alive or role.paused_until is not None:
            return False
        role.expected_exit = True
        self._signal(role, signal.SIGKILL)
        assert role.popen is not None
        role.popen.wait()
        self._note_exit(role, time.monotonic())
        role.restart_at = time.monotonic() + restart_in_s
        return True

    def pause(self, role: Role, seconds: float) -> bool:
        """SIGSTOP the role's process group for ``seconds``, then SIGCONT."""
        if not role.alive or role.paused_until is not None:
            return False
        self._signal(role, signal.SIGSTOP)
        role.paused_until = time.monotonic() + seconds
        return True

    def tick(self) -> None:
        """Resume paused roles, notice exits, and start again those whose delay has passed."""
        now = time.monotonic()
        for role in self.roles:
            if role.paused_until is not None and now >= role.paused_until:
                self._signal(role, signal.SIGCONT)
                role.paused_until = None
            if role.popen is not None and role.restart_at is None and not role.alive:
                self._note_exit(role, now)
                role.restart_at = now + self.restart_delay_s
            if role.restart_at is not None and now >= role.restart_at:
                self.start(role)

    def _note_exit(self, role: Role, now: float) -> None:
        assert role.popen is not None
        tail = ""
        if not role.expected_exit:
            with contextlib.suppress(OSError):
                tail = role.log.read_text(errors="replace")[-3000:]
        self.exits.append(Exit(role.name, now, role.popen.returncode, role.expected_exit, tail))

    def stop_role(self, role: Role, grace_s: float = 10.0) -> None:
        """Stop one role for good (the end of a phase): SIGTERM, then SIGKILL."""
        if role in self.roles:
            self.roles.remove(role)
        if role.popen is None:
            return
        self._signal(role, signal.SIGCONT)
        self._signal(role, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            role.popen.wait(timeout=grace_s)
        self._signal(role, signal.SIGKILL)
        role.popen.wait()

    def stop_all(self, grace_s: float = 10.0) -> None:
        for role in self.roles:
            if role.alive:
                self._signal(role, signal.SIGCONT)
                self._signal(role, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for role in self.roles:
            if role.popen is None:
                continue
            try:
                role.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._signal(role, signal.SIGKILL)
                role.popen.wait()
            # Celery's pool processes outlive a killed parent unless the group is ended too.
            self._signal(role, signal.SIGKILL)

    @staticmethod
    def _signal(role: Role, signum: int) -> None:
        if role.popen is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(role.popen.pid, signum)
