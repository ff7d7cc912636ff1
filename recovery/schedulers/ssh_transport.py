"""Scheduler commands over SSH, and job output over SFTP (paramiko): ``SSHTransport``.

Apart from ``LocalTransport`` (``recovery.schedulers.transport``): the connection, when a
command may be sent again and the host-key rules are the SSH side's alone. The pipelined SFTP
requests a batch of output files is opened with are in ``recovery.schedulers.sftp_batch``.
"""

from __future__ import annotations

import contextlib
import re
import select
import shlex
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from recovery.schedulers.base import CommandResult, Connection, SchedulerError
from recovery.schedulers.output_files import (
    OutputAccess,
    OutputFile,
    OutputRefused,
    PrefetchedOutput,
    access_for,
    check_file,
)
from recovery.schedulers.sftp_batch import (
    BATCH_FILES,
    READ_REQUEST,
    SFTPOutput,
    _exchange,
    _Failure,
    _failure,
    _passes_lstat,
    _refused_or_absent,
    _size_of,
    _stat_answer,
    _Wanted,
)
from recovery.schedulers.transport import MAX_OUTPUT_BYTES, _statable


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
        # How many times this transport connected, and opened an SFTP session: once each while
        # the connection holds, however many polls use it.
        self.connections_opened = 0
        self.sftp_sessions_opened = 0

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
            self.connections_opened += 1
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
            # Pipelined SFTP requests leave at once instead of waiting, Nagle's way, for the
            # first one to be acknowledged: a round trip per batch step saved.
            if isinstance(transport.sock, socket.socket):
                with contextlib.suppress(OSError):
                    transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
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

    def output_sizes(self, paths: Sequence[str]) -> dict[str, int | None]:
        """Each path's size as ``lstat`` sees it, or None; one pipelined exchange for all."""
        sizes: dict[str, int | None] = dict.fromkeys(paths)
        asked = [path for path in sizes if _statable(path)]
        if not asked:
            return sizes

        def lstat_all(sftp: Any) -> list[int | None]:
            from paramiko.sftp import CMD_LSTAT

            answers = _exchange(sftp, [(CMD_LSTAT, (path,)) for path in asked])
            return [_size_of(kind, message) for kind, message in answers]

        with self._lock:
            found = self._with_sftp(f"the sizes of {len(asked)} files", lstat_all)
        sizes.update(zip(asked, found))
        return sizes

    def open_output(self, path: str, access: OutputAccess) -> OutputFile | None:
        """The job's output file under the rules of ``output_files``, or None when absent: a
        batch of one (``open_outputs``) whose handle stays open for the reads that follow."""
        outcome = self._open_batch({path: 0}, access, 0, keep_open=True)[path]
        if isinstance(outcome, OutputRefused):
            raise outcome
        return outcome

    def open_outputs(
        self,
        wanted: Mapping[str, int],
        access: OutputAccess | Mapping[str, OutputAccess],
        limit: int,
    ) -> dict[str, OutputFile | OutputRefused | None]:
        """Job output files under the rules of ``output_files``, each read ahead by up to
        ``limit`` bytes from its offset in ``wanted`` (from 0 when the file is now shorter than
        that offset: it was truncated), and closed.

        SFTP has no ``openat`` and no ``O_NOFOLLOW``: every directory on a file's way is checked
        with ``lstat`` (no link, a directory), then the file (a regular file of the job's uid),
        and the opened handle again with ``fstat``; only then is it read. A component swapped for
        a link between those checks and the open is not seen, but whatever was opened is still a
        regular file owned by the job's user (no inode is given over SFTP to compare). A FIFO
        swapped in at that instant blocks the server's open until the SFTP timeout.

        Each step is sent for every file of a chunk of ``BATCH_FILES`` before the answers are
        read (a directory many files share is looked at once per batch), so a chunk costs four
        round trips (lstat, open, fstat, read) whatever its size; the handles are closed without
        waiting before the next chunk opens any. A file's ``lstat`` goes with its directories':
        what it says counts only once every directory passed, and ``lstat`` opens nothing. While
        a FIFO blocks the server every file of the batch waits, and the batch is tried again once
        (when ``lstat`` sees the FIFO and refuses it). A read beyond what was read ahead opens the
        file again, under the same checks.
        """
        return self._open_batch(wanted, access, limit, keep_open=False)

    def _open_batch(
        self,
        wanted: Mapping[str, int],
        access: OutputAccess | Mapping[str, OutputAccess],
        limit: int,
        *,
        keep_open: bool,
    ) -> dict[str, OutputFile | OutputRefused | None]:
        outcomes: dict[str, OutputFile | OutputRefused | None] = {}
        admitted: list[_Wanted] = []
        for path, offset in wanted.items():
            rules = access_for(access, path)
            try:
                names = rules.admit(path)
            except OutputRefused as refused:
                outcomes[path] = refused
                continue
            assert rules.owner_uid is not None  # admit() refuses an unknown owner
            admitted.append(_Wanted(path, names, rules, rules.owner_uid, offset))
        if admitted:

            def open_all(sftp: Any) -> dict[str, OutputFile | OutputRefused | None]:
                opened: dict[str, OutputFile | OutputRefused | None] = {}
                known: dict[str, Any] = {}
                for first in range(0, len(admitted), BATCH_FILES):
                    chunk = admitted[first : first + BATCH_FILES]
                    opened.update(self._open_chunk(sftp, chunk, known, limit, keep_open))
                return opened

            shown = admitted[0].shown if len(admitted) == 1 else f"{len(admitted)} output files"
            with self._lock:
                opened = self._with_sftp(shown, open_all)
            outcomes.update(opened or dict.fromkeys(want.path for want in admitted))
        return {path: outcomes[path] for path in wanted}

    def _open_chunk(
        self,
        sftp: Any,
        chunk: list[_Wanted],
        known: dict[str, Any],
        limit: int,
        keep_open: bool,
    ) -> dict[str, OutputFile | OutputRefused | None]:
        """Opens ``chunk`` a step at a time, each step pipelined across its files. ``known``
        holds what ``lstat`` said of each path this batch looked at, for the next chunks."""
        from paramiko.sftp import (
            CMD_CLOSE,
            CMD_DATA,
            CMD_FSTAT,
            CMD_HANDLE,
            CMD_LSTAT,
            CMD_OPEN,
            CMD_READ,
            SFTP_FLAG_READ,
            int64,
        )
        from paramiko.sftp_attr import SFTPAttributes
        from paramiko.sftp_file import SFTPFile

        outcomes: dict[str, OutputFile | OutputRefused | None] = {}
        unseen = dict.fromkeys(
            where
            for want in chunk
            for where in (*want.directories, want.shown)
            if where not in known
        )
        answers = _exchange(sftp, [(CMD_LSTAT, (where,)) for where in unseen])
        known.update(zip(unseen, (_stat_answer(*answer) for answer in answers)))

        to_open: list[_Wanted] = []
        for want in chunk:
            try:
                if _passes_lstat(want, known):
                    to_open.append(want)
                else:
                    outcomes[want.path] = None
            except OutputRefused as refused:
                outcomes[want.path] = refused

        answers = _exchange(
            sftp, [(CMD_OPEN, (want.shown, SFTP_FLAG_READ, SFTPAttributes())) for want in to_open]
        )
        handles: list[tuple[_Wanted, bytes]] = []
        for want, (kind, message) in zip(to_open, answers):
            if kind == CMD_HANDLE:
                handles.append((want, message.get_binary()))
            else:
                outcomes[want.path] = _refused_or_absent(want.shown, _failure(kind, message))

        answers = _exchange(sftp, [(CMD_FSTAT, (handle,)) for _, handle in handles])
        checked: list[tuple[_Wanted, bytes, int]] = []
        to_close: list[bytes] = []
        for (want, handle), answer in zip(handles, answers):
            opened = _stat_answer(*answer)
            try:
                if isinstance(opened, _Failure):
                    raise opened.refusal(want.shown)
                check_file(want.shown, opened.st_mode, opened.st_uid, want.owner_uid)
            except OutputRefused as refused:
                outcomes[want.path] = refused
                to_close.append(handle)
                continue
            checked.append((want, handle, int(opened.st_size or 0)))

        if keep_open:
            for want, handle, size in checked:
                where = f"{want.shown} over SFTP from {self._where}"
                file = SFTPFile(sftp, handle, "r")
                outcomes[want.path] = SFTPOutput(file, size, where, self._lock)
        else:
            spans: list[tuple[int, int, int]] = []  # (file, offset, length) of each READ
            starts = []
            for index, (want, _, size) in enumerate(checked):
                start = want.offset if want.offset <= size else 0
                starts.append(start)
                end = min(size, start + max(limit, 0))
                spans += [
                    (index, at, min(READ_REQUEST, end - at))
                    for at in range(start, end, READ_REQUEST)
                ]
            answers = _exchange(
                sftp,
                [(CMD_READ, (checked[index][1], int64(at), length)) for index, at, length in spans],
            )
            pieces: list[list[bytes]] = [[] for _ in checked]
            stopped = [False] * len(checked)
            for (index, _, length), (kind, message) in zip(spans, answers):
                if stopped[index]:
                    continue
                data = message.get_string() if kind == CMD_DATA else b""
                pieces[index].append(data)
                # After a short answer (the end of the file, or a server that reads less),
                # what follows is no longer contiguous: a read past it opens the file again.
                stopped[index] = len(data) < length
            for (want, handle, size), start, parts in zip(checked, starts, pieces):
                outcomes[want.path] = PrefetchedOutput(
                    size, start, b"".join(parts), self._rereader(want)
                )
                to_close.append(handle)
        for handle in to_close:
            # As paramiko's own asynchronous close: the answer is read, and dropped, later.
            sftp._async_request(type(None), CMD_CLOSE, handle)
        return outcomes

    def _rereader(self, want: _Wanted) -> Callable[[int, int], bytes]:
        def reread(offset: int, limit: int) -> bytes:
            outcome = self._open_batch({want.path: 0}, want.access, 0, keep_open=True)[want.path]
            if outcome is None:
                return b""  # gone since: nothing more to read from it
            if isinstance(outcome, OutputRefused):
                raise SchedulerError(f"{want.shown} can no longer be read: {outcome}")
            with contextlib.closing(outcome):
                return outcome.read(offset, limit)

        return reread

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
                self.sftp_sessions_opened += 1
            return self._sftp
