"""How scheduler commands reach the scheduler: on this host, or over SSH."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from recovery.schedulers.base import CommandResult, SchedulerError

MAX_OUTPUT_BYTES = 64 * 1024 * 1024


class LocalTransport:
    """Runs commands as subprocesses of this process (a login or controller node)."""

    name = "local"

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


class SSHTransport:
    """Runs commands on a remote login node over SSH (paramiko), with nothing installed there.

    The host key must already be in ``known_hosts``: an unknown or changed key is refused,
    never accepted. One connection is reused and re-opened when it drops.
    """

    name = "ssh"

    def __init__(
        self,
        host: str,
        *,
        user: str,
        key_file: str,
        known_hosts: str,
        port: int = 22,
        env: Mapping[str, str] | None = None,
        connect_timeout: float = 10.0,
    ) -> None:
        self.host = host
        self.port = port
        self.user = user
        self.key_file = key_file
        self.known_hosts = known_hosts
        self.env = dict(env or {})
        self.connect_timeout = connect_timeout
        self._client: Any = None

    def _connect(self) -> Any:
        import paramiko

        client = self._client
        if client is not None:
            transport = client.get_transport()
            if transport is not None and transport.is_active():
                return client
            client.close()
        client = paramiko.SSHClient()
        try:
            client.load_host_keys(self.known_hosts)
        except OSError as exc:
            raise SchedulerError(f"cannot read known_hosts {self.known_hosts}: {exc}") from None
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            client.connect(
                self.host,
                port=self.port,
                username=self.user,
                key_filename=self.key_file,
                timeout=self.connect_timeout,
                banner_timeout=self.connect_timeout,
                auth_timeout=self.connect_timeout,
                allow_agent=False,
                look_for_keys=False,
            )
        except paramiko.BadHostKeyException:
            raise SchedulerError(
                f"the host key of {self.host}:{self.port} does not match known_hosts: refused"
            ) from None
        except paramiko.SSHException as exc:
            raise SchedulerError(
                f"SSH to {self.user}@{self.host}:{self.port} failed: {exc}"
            ) from None
        except OSError as exc:
            raise SchedulerError(f"cannot reach {self.host}:{self.port}: {exc}") from None
        self._client = client
        return client

    def run(self, argv: Sequence[str], *, timeout: float = 30.0) -> CommandResult:
        import paramiko

        command = tuple(argv)
        # The remote side runs a shell: every argument is quoted, so none is interpreted.
        prefix = ["env", *(f"{key}={value}" for key, value in self.env.items())] if self.env else []
        remote = shlex.join([*prefix, *command])
        for attempt in (1, 2):
            client = self._connect()
            try:
                _, stdout, stderr = client.exec_command(remote, timeout=timeout)
                out = stdout.read(MAX_OUTPUT_BYTES)
                err = stderr.read(MAX_OUTPUT_BYTES)
                code = stdout.channel.recv_exit_status()
            except (paramiko.SSHException, EOFError, OSError) as exc:
                self.close()
                if attempt == 2:
                    raise SchedulerError(f"`{' '.join(command)}` over SSH failed: {exc}") from None
                continue
            return CommandResult(
                argv=command,
                returncode=code,
                stdout=out.decode("utf-8", errors="replace"),
                stderr=err.decode("utf-8", errors="replace"),
            )
        raise AssertionError("unreachable")

    def read_file(self, path: str, offset: int, limit: int) -> bytes:
        sftp = self._connect().open_sftp()
        try:
            with sftp.open(path, "rb") as handle:
                handle.seek(offset)
                return bytes(handle.read(limit))
        except FileNotFoundError:
            return b""
        finally:
            sftp.close()

    def file_size(self, path: str) -> int | None:
        sftp = self._connect().open_sftp()
        try:
            return int(sftp.stat(path).st_size or 0)
        except FileNotFoundError:
            return None
        finally:
            sftp.close()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
