"""How scheduler commands reach the scheduler: on this host, or over SSH.

Here: ``LocalTransport``, and what both transports share (how much of a command's output is
kept, which paths an output file can have). ``SSHTransport`` is in
``recovery.schedulers.ssh_transport``: its connection, host-key rules and SFTP reads are its own.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from recovery.schedulers.base import CommandResult, Connection, SchedulerError
from recovery.schedulers.output_files import (
    OutputAccess,
    OutputFile,
    OutputRefused,
    PrefetchedOutput,
    access_for,
    cannot_open,
    open_local_output,
    path_components,
)

MAX_OUTPUT_BYTES = 64 * 1024 * 1024


class LocalTransport:
    """Runs commands as subprocesses of this process (a login or controller node)."""

    name: str = Connection.LOCAL

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self._env = {**os.environ, **(env or {})}

    def run(self, argv: Sequence[str], *, timeout: float = 30.0) -> CommandResult:
        command = tuple(argv)
        try:
            completed = subprocess.run(
                command,
                capture_output=True,
                env=self._env,
                timeout=timeout,
                check=False,
            )
        except FileNotFoundError:
            raise SchedulerError(f"`{command[0]}` is not installed on this host") from None
        except subprocess.TimeoutExpired:
            raise SchedulerError(
                f"`{' '.join(command)}` did not finish within {timeout:g} s"
            ) from None
        return CommandResult(
            argv=command,
            returncode=completed.returncode,
            stdout=completed.stdout[:MAX_OUTPUT_BYTES].decode("utf-8", errors="replace"),
            stderr=completed.stderr[:MAX_OUTPUT_BYTES].decode("utf-8", errors="replace"),
        )

    def read_file(self, path: str, offset: int, limit: int) -> bytes:
        try:
            with Path(path).open("rb") as handle:
                handle.seek(offset)
                return handle.read(limit)
        except FileNotFoundError:
            return b""

    def file_size(self, path: str) -> int | None:
        try:
            return Path(path).stat().st_size
        except FileNotFoundError:
            return None

    def open_output(self, path: str, access: OutputAccess) -> OutputFile | None:
        return open_local_output(path, access)

    def output_sizes(self, paths: Sequence[str]) -> dict[str, int | None]:
        sizes: dict[str, int | None] = {}
        for path in paths:
            try:
                sizes[path] = os.lstat(path).st_size if _statable(path) else None
            except OSError:
                sizes[path] = None
        return sizes

    def open_outputs(
        self,
        wanted: Mapping[str, int],
        access: OutputAccess | Mapping[str, OutputAccess],
        limit: int,
    ) -> dict[str, OutputFile | OutputRefused | None]:
        """Each file opened with ``open_output``, read ahead from its offset (from 0 when it is
        now shorter: it was truncated) and closed again: a batch may name more files than this
        process may hold open."""
        outcomes: dict[str, OutputFile | OutputRefused | None] = {}
        for path, offset in wanted.items():
            rules = access_for(access, path)
            try:
                output = open_local_output(path, rules)
                if output is None:
                    outcomes[path] = None
                    continue
                with contextlib.closing(output):
                    start = offset if offset <= output.size else 0
                    data = output.read(start, min(max(limit, 0), output.size - start))
            except OutputRefused as refused:
                outcomes[path] = refused
                continue
            except OSError as error:
                outcomes[path] = cannot_open(path, error)
                continue
            outcomes[path] = PrefetchedOutput(output.size, start, data, self._rereader(path, rules))
        return outcomes

    @staticmethod
    def _rereader(path: str, access: OutputAccess) -> Callable[[int, int], bytes]:
        def reread(offset: int, limit: int) -> bytes:
            try:
                output = open_local_output(path, access)
            except OutputRefused as refused:
                raise SchedulerError(f"{path} can no longer be read: {refused}") from None
            if output is None:
                return b""  # gone since: nothing more to read from it
            with contextlib.closing(output):
                return output.read(offset, limit)

        return reread


def _statable(path: str) -> bool:
    """Whether ``path`` is one an output file can have (absolute, no NUL byte)."""
    try:
        return bool(path_components(path))
    except OutputRefused:
        return False
