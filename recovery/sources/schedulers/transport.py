"""How scheduler commands reach the scheduler: on this host, or over SSH."""

from __future__ import annotations

import contextlib
import os
import re
import select
import shlex
import stat
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from recovery.sources.schedulers.base import CommandResult, Connection, SchedulerError
from recovery.sources.schedulers.output_files import (
    OutputAccess,
    OutputFile,
    OutputRefusal,
    OutputRefused,
    check_file,
    joined,
    open_local_output,
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


class SSHTransport:
    """Runs commands on a remote login node over SSH (paramiko), with nothing installed there.

    The host key must already be in ``known_hosts``: an unknown or changed key is refused,
    never accepted. One connection is reused and re-opened when it drops. Commands go to the
    remote user's login shell as one string in which every argument is quoted with ``shlex``,
    so that shell must be a POSIX one (sh, bash, dash, zsh), not csh. Files are read by SFTP.

    A command is re-sent on a fresh connection only when the old one failed before the
    command could start; once it may have started, a failure is reported, never retried
    (``scontrol requeue`` must not run twice).
    """

    name: str = Connection.SSH
    ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
    READ_CHUNK = 64 * 1024
    SFTP_TIMEOUT = 30.0
    KEEPALIVE_SECONDS = 30

    class _UnknownHost(Exception):
        """Raised by the host key policy: the server's key is not in known_hosts."""

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
        for key in self.env:
            if not self.ENV_NAME.fullmatch(key):
                raise ValueError(f"not an environment variable name: {key!r}")
        self.connect_timeout = connect_timeout
        self._client: Any = None
        self._sftp: Any = None
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ connection

    @property
    def _where(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    def _connect(self) -> Any:
        """The open connection, or a new one when there is none or it has dropped."""
        with self._lock:
            client = self._client
            if client is not None:
                transport = client.get_transport()
                if transport is not None and transport.is_active():
                    return client
                self.close()
            client = self._open_client()
            self._client = client
            return client

    def _open_client(self) -> Any:
        import paramiko

        transport_class = type(self)

        class RefuseUnknownHost(paramiko.RejectPolicy):
            def missing_host_key(self, client: Any, hostname: str, key: Any) -> NoReturn:
                raise transport_class._UnknownHost(f"{key.get_name()} {key.fingerprint}")

        pkey = self._load_key()
        client = paramiko.SSHClient()
        try:
            client.load_host_keys(self.known_hosts)
        except OSError as exc:
            raise SchedulerError(f"cannot read known_hosts {self.known_hosts}: {exc}") from None
        client.set_missing_host_key_policy(RefuseUnknownHost())
        try:
            client.connect(
                self.host,
                port=self.port,
                username=self.user,
                pkey=pkey,
                timeout=self.connect_timeout,
                banner_timeout=self.connect_timeout,
                auth_timeout=self.connect_timeout,
                channel_timeout=self.connect_timeout,
                allow_agent=False,
                look_for_keys=False,
            )
        except transport_class._UnknownHost as exc:
            client.close()
            raise SchedulerError(
                f"the host key of {self.host}:{self.port} is not in {self.known_hosts}: refused"
                f" (the server offered {exc}; add it to known_hosts once you have checked it)"
            ) from None
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise SchedulerError(
                f"the host key of {self.host}:{self.port} does not match {self.known_hosts}:"
                f" refused (the server offered {exc.key.get_name()} {exc.key.fingerprint},"
                f" known_hosts holds {exc.expected_key.get_name()}"
                f" {exc.expected_key.fingerprint})"
            ) from None
        except paramiko.AuthenticationException as exc:
            client.close()
            raise SchedulerError(
                f"SSH authentication failed for {self._where}: the server did not accept the"
                f" key {self.key_file} ({exc})"
            ) from None
        except paramiko.SSHException as exc:
            client.close()
            raise SchedulerError(f"SSH to {self._where} failed: {exc}") from None
        except OSError as exc:
            client.close()
            raise SchedulerError(f"cannot reach {self.host}:{self.port}: {exc}") from None
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(self.KEEPALIVE_SECONDS)
        return client

    def _load_key(self) -> Any:
        import paramiko

        try:
            return paramiko.PKey.from_path(self.key_file)
        except paramiko.PasswordRequiredException:
            raise SchedulerError(
                f"the SSH key {self.key_file} is protected by a passphrase; use one without"
            ) from None
        except OSError as exc:
            raise SchedulerError(f"cannot read the SSH key {self.key_file}: {exc}") from None
        except (paramiko.SSHException, paramiko.pkey.UnknownKeyType, ValueError) as exc:
            raise SchedulerError(f"{self.key_file} is not a usable SSH key: {exc}") from None

    def _discard(self, transport: Any) -> None:
        """Close the connection ``transport`` belongs to, unless a new one replaced it."""
        with self._lock:
            current = self._client.get_transport() if self._client is not None else None
            if current is transport:
                self.close()

    def close(self) -> None:
        with self._lock:
            sftp, self._sftp = self._sftp, None
            client, self._client = self._client, None
            if sftp is not None:
                sftp.close()
            if client is not None:
                client.close()

    # ------------------------------------------------------------------ commands

    def run(self, argv: Sequence[str], *, timeout: float = 30.0) -> CommandResult:
        import paramiko

        command = tuple(argv)
        if not command:
            raise ValueError("no command given")
        shown = " ".join(command)
        # The remote side runs a shell: every argument is quoted, so none is interpreted.
        prefix = ["env", *(f"{key}={value}" for key, value in self.env.items())] if self.env else []
        remote = shlex.join([*prefix, *command])
        deadline = time.monotonic() + timeout
        channel = self._open_channel(shown)
        try:
            try:
                channel.exec_command(remote)
                channel.shutdown_write()  # nothing on stdin
                out, err = self._collect(channel, deadline)
            except TimeoutError:
                raise SchedulerError(f"`{shown}` did not finish within {timeout:g} s") from None
            except (paramiko.SSHException, EOFError, OSError) as exc:
                self._discard(channel.get_transport())
                raise SchedulerError(
                    f"`{shown}` over SSH to {self._where} failed, and may have run: {exc}"
                ) from None
            # -1 is "no exit status": killed by a signal, or the connection dropped.
            code = channel.exit_status
            if not self._connection_alive(channel):
                self._discard(channel.get_transport())
                if code == -1:
                    raise SchedulerError(
                        f"the SSH connection to {self._where} dropped while `{shown}` ran,"
                        " and it may have run"
                    )
        finally:
            channel.close()
        return CommandResult(
            argv=command,
            returncode=code,
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err.decode("utf-8", errors="replace"),
        )

    def _open_channel(self, shown: str) -> Any:
        """A session channel; a connection that turns out dead is replaced once."""
        import paramiko

        for attempt in (1, 2):
            transport = self._connect().get_transport()
            try:
                if transport is None:
                    raise paramiko.SSHException("the connection is closed")
                return transport.open_session(timeout=self.connect_timeout)
            except (paramiko.SSHException, EOFError, OSError) as exc:
                self._discard(transport)
                if attempt == 2:
                    raise SchedulerError(
                        f"`{shown}` did not start: SSH to {self._where} failed: {exc}"
                    ) from None
        raise AssertionError("unreachable")

    @staticmethod
    def _connection_alive(channel: Any) -> bool:
        transport = channel.get_transport()
        return transport is not None and transport.is_active()

    def _collect(self, channel: Any, deadline: float) -> tuple[bytes, bytes]:
        """Stdout and stderr until the remote side ends both, read side by side so that a
        command filling one of them cannot stall; then waits for the exit status."""
        out = bytearray()
        err = bytearray()

        def drain() -> None:
            while channel.recv_ready():
                data = channel.recv(self.READ_CHUNK)
                out.extend(data[: max(0, MAX_OUTPUT_BYTES - len(out))])
            while channel.recv_stderr_ready():
                data = channel.recv_stderr(self.READ_CHUNK)
                err.extend(data[: max(0, MAX_OUTPUT_BYTES - len(err))])

        while not (channel.eof_received or channel.closed):
            drain()
            if channel.eof_received or channel.closed:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            # The channel's pipe becomes readable when either stream has data, or at EOF.
            select.select([channel], [], [], min(remaining, 1.0))
        drain()  # after EOF nothing more arrives: what is buffered is all there is
        if not channel.status_event.wait(max(0.0, deadline - time.monotonic())):
            raise TimeoutError
        return bytes(out), bytes(err)

    # ------------------------------------------------------------------ files

    def read_file(self, path: str, offset: int, limit: int) -> bytes:
        def read(sftp: Any) -> bytes:
            with sftp.open(path, "rb") as handle:
                handle.seek(offset)
                return bytes(handle.read(limit))

        data = self._with_sftp(path, read)
        return b"" if data is None else data

    def file_size(self, path: str) -> int | None:
        size: int | None = self._with_sftp(path, lambda sftp: int(sftp.stat(path).st_size or 0))
        return size

    def open_output(self, path: str, access: OutputAccess) -> OutputFile | None:
        """The job's output file under the rules of ``output_files``, or None when absent.

        SFTP has no ``openat`` and no ``O_NOFOLLOW``: each directory on the way is checked with
        ``lstat`` (no link, a directory), then the file (a regular file of the job's uid), and
        the opened handle again with ``fstat``. A component swapped for a link between those
        checks and the open is not seen, but whatever was opened is still a regular file owned
        by the job's user (no inode is given over SFTP to compare). A FIFO swapped in at that
        instant blocks the server's open until the SFTP timeout.
        """
        names = access.admit(path)
        owner_uid = access.owner_uid
        assert owner_uid is not None  # admit() refuses an unknown owner
        shown = joined(names)

        def open_checked(sftp: Any) -> SFTPOutput | None:
            try:
                for depth in range(1, len(names)):
                    where = joined(names[:depth])
                    mode = sftp.lstat(where).st_mode
                    if mode is not None and stat.S_ISLNK(mode):
                        raise OutputRefused(OutputRefusal.SYMLINK, f"{where} is a symbolic link")
                    if mode is None or not stat.S_ISDIR(mode):
                        return None  # not a directory: the output cannot exist
                seen = sftp.lstat(shown)
                check_file(shown, seen.st_mode, seen.st_uid, owner_uid)
                handle = sftp.open(shown, "rb")
            except PermissionError as error:
                raise OutputRefused(
                    OutputRefusal.UNREADABLE, f"{shown} cannot be opened: {error.strerror or error}"
                ) from None
            output = SFTPOutput(handle, 0, f"{shown} over SFTP from {self._where}")
            try:
                opened = handle.stat()
                check_file(shown, opened.st_mode, opened.st_uid, owner_uid)
            except BaseException:
                output.close()
                raise
            output.size = int(opened.st_size or 0)
            return output

        output: SFTPOutput | None = self._with_sftp(shown, open_checked)
        return output

    def _with_sftp(self, path: str, action: Any) -> Any:
        """``action(sftp)``, or None when ``path`` does not exist. Reading changes nothing,
        so a connection that fails is replaced and the read tried again, once."""
        import paramiko

        for attempt in (1, 2):
            sftp = None
            try:
                sftp = self._sftp_client()
                return action(sftp)
            except FileNotFoundError:
                return None
            except (paramiko.SSHException, EOFError, ConnectionError, TimeoutError) as exc:
                if sftp is None:
                    self.close()
                else:
                    self._discard(sftp.get_channel().get_transport())
                if attempt == 2:
                    raise SchedulerError(
                        f"cannot read {path} over SFTP from {self._where}: {exc}"
                    ) from None
            except OSError as exc:  # the server refused: permission denied, a directory...
                raise SchedulerError(
                    f"cannot read {path} over SFTP from {self._where}: {exc}"
                ) from None
        raise AssertionError("unreachable")

    def _sftp_client(self) -> Any:
        with self._lock:
            client = self._connect()
            if self._sftp is None or self._sftp.get_channel().closed:
                sftp = client.open_sftp()
                sftp.get_channel().settimeout(self.SFTP_TIMEOUT)
                self._sftp = sftp
            return self._sftp


class SFTPOutput:
    """A job's output file open over SFTP. A connection lost while reading fails the read; the
    poller reads the same bytes again next time."""

    def __init__(self, handle: Any, size: int, shown: str) -> None:
        self._handle = handle
        self.size = size
        self._shown = shown

    def read(self, offset: int, limit: int) -> bytes:
        import paramiko

        try:
            self._handle.seek(offset)
            return bytes(self._handle.read(limit))
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise SchedulerError(f"cannot read {self._shown}: {exc}") from None

    def close(self) -> None:
        import paramiko

        # A handle on a lost connection is gone with it: nothing left to close.
        with contextlib.suppress(paramiko.SSHException, EOFError, OSError):
            self._handle.close()
