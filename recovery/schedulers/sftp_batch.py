"""The SFTP side of ``SSHTransport``'s output reads: requests pipelined, and what they open.

paramiko's SFTP client waits for each answer before the next request; a batch of output files
sends each step's requests for all its files at once (``_exchange``) and makes sense of the
answers here, so that ``recovery.schedulers.ssh_transport`` only strings the steps together.
``SFTPOutput`` is a file such a batch left open.
"""

from __future__ import annotations

import contextlib
import stat
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from recovery.schedulers.base import SchedulerError
from recovery.schedulers.output_files import (
    OutputAccess,
    OutputRefusal,
    OutputRefused,
    check_file,
    joined,
)


class SFTPOutput:
    """A job's output file open over SFTP. A connection lost while reading fails the read; the
    poller reads the same bytes again next time."""

    def __init__(self, handle: Any, size: int, shown: str, lock: Any = None) -> None:
        self._handle = handle
        self.size = size
        self._shown = shown
        self._lock = lock if lock is not None else threading.RLock()

    def read(self, offset: int, limit: int) -> bytes:
        """Up to ``limit`` bytes from ``offset``: the part up to the size the file had when it
        was opened (and one request beyond, for what it wrote since) asked for all at once."""
        import paramiko
        from paramiko.sftp import CMD_DATA, CMD_READ, int64

        end = offset + max(limit, 0)
        ahead = min(end, max(self.size, offset) + READ_REQUEST)
        spans = [(at, min(READ_REQUEST, ahead - at)) for at in range(offset, ahead, READ_REQUEST)]
        handle = self._handle
        try:
            with self._lock:
                answers = _exchange(
                    handle.sftp,
                    [(CMD_READ, (handle.handle, int64(at), length)) for at, length in spans],
                )
                data = bytearray()
                for (at, length), (kind, message) in zip(spans, answers):
                    if kind != CMD_DATA:
                        _failure(kind, message).raise_unless_end()
                        return bytes(data)
                    piece = message.get_string()
                    data += piece
                    if len(piece) < length:
                        if at + len(piece) >= self.size:
                            return bytes(data)  # the end of the file
                        break  # a server that answers less than asked: the rest in turn
                if offset + len(data) < min(end, self.size):
                    handle.seek(offset + len(data))
                    data += handle.read(min(end, self.size) - offset - len(data))
                return bytes(data)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise SchedulerError(f"cannot read {self._shown}: {exc}") from None

    def close(self) -> None:
        import paramiko

        # A handle on a lost connection is gone with it: nothing left to close. The answer to
        # the close is not waited for.
        with self._lock, contextlib.suppress(paramiko.SSHException, EOFError, OSError):
            self._handle._close(async_=True)


# Files whose handles one batch holds open at once on the server: each chunk's are closed before
# the next chunk opens any, far below sftp-server's limit on open files.
BATCH_FILES = 256
# SFTP requests sent before the first answer is read.
PIPELINE_DEPTH = 256
# paramiko's largest read request (SFTPFile.MAX_REQUEST_SIZE), one every server answers in full.
READ_REQUEST = 32 * 1024


@dataclass(frozen=True)
class _Wanted:
    """One file of a batch: its path, its components as ``admit`` gave them, whose it must be,
    and the offset to read it from."""

    path: str
    names: tuple[str, ...]
    access: OutputAccess
    owner_uid: int
    offset: int

    @property
    def shown(self) -> str:
        return joined(self.names)

    @property
    def directories(self) -> list[str]:
        return [joined(self.names[:depth]) for depth in range(1, len(self.names))]


@dataclass(frozen=True)
class _Failure:
    """An SFTP status answer that is not success."""

    code: int
    text: str

    @property
    def absent(self) -> bool:
        from paramiko.sftp import SFTP_NO_SUCH_FILE

        return self.code == SFTP_NO_SUCH_FILE

    def refusal(self, shown: str) -> OutputRefused:
        return OutputRefused(OutputRefusal.UNREADABLE, f"{shown} cannot be opened: {self.text}")

    def raise_unless_end(self) -> None:
        from paramiko.sftp import SFTP_EOF

        if self.code != SFTP_EOF:
            raise OSError(self.text)


class _Answers:
    """What the server answered to pipelined requests, by request number: paramiko hands each
    answer to the object its request was sent for."""

    def __init__(self) -> None:
        self.received: dict[int, tuple[int, Any]] = {}

    def _async_response(self, kind: int, message: Any, number: int) -> None:
        self.received[number] = (kind, message)


def _exchange(sftp: Any, requests: Sequence[tuple[int, tuple[Any, ...]]]) -> list[tuple[int, Any]]:
    """The answers to ``requests`` (type and arguments of each), in their order, with up to
    ``PIPELINE_DEPTH`` of them on the way at once instead of one per round trip."""
    answers = _Answers()
    numbers: list[int] = []
    for kind, arguments in requests:
        while len(numbers) - len(answers.received) >= PIPELINE_DEPTH:
            sftp._read_response()
        numbers.append(sftp._async_request(answers, kind, *arguments))
    while len(answers.received) < len(numbers):
        sftp._read_response()
    return [answers.received.pop(number) for number in numbers]


def _failure(kind: int, message: Any) -> _Failure:
    import paramiko
    from paramiko.sftp import CMD_STATUS

    if kind != CMD_STATUS:
        raise paramiko.SSHException(f"the SFTP server answered with message type {kind}")
    code = message.get_int()
    return _Failure(code, message.get_text())


def _stat_answer(kind: int, message: Any) -> Any:
    """The ``SFTPAttributes`` an (l|f)stat answered, or the ``_Failure``."""
    from paramiko.sftp import CMD_ATTRS
    from paramiko.sftp_attr import SFTPAttributes

    if kind == CMD_ATTRS:
        return SFTPAttributes._from_msg(message)  # type: ignore[attr-defined]  # not in the stubs
    return _failure(kind, message)


def _size_of(kind: int, message: Any) -> int | None:
    seen = _stat_answer(kind, message)
    if isinstance(seen, _Failure) or seen.st_size is None:
        return None
    return int(seen.st_size)


def _refused_or_absent(shown: str, failure: _Failure) -> OutputRefused | None:
    return None if failure.absent else failure.refusal(shown)


def _passes_lstat(want: _Wanted, known: Mapping[str, Any]) -> bool:
    """Whether what ``lstat`` said lets ``want`` be opened: False when it cannot exist (a
    directory on the way is missing or not one, or the file is missing); refuses a link on the
    way, and a file that is not a regular one of the job's user."""
    for where in want.directories:
        seen = known[where]
        if isinstance(seen, _Failure):
            if seen.absent:
                return False
            raise seen.refusal(want.shown)
        mode = seen.st_mode
        if mode is not None and stat.S_ISLNK(mode):
            raise OutputRefused(OutputRefusal.SYMLINK, f"{where} is a symbolic link")
        if mode is None or not stat.S_ISDIR(mode):
            return False  # not a directory: the output cannot exist
    seen = known[want.shown]
    if isinstance(seen, _Failure):
        if seen.absent:
            return False
        raise seen.refusal(want.shown)
    check_file(want.shown, seen.st_mode, seen.st_uid, want.owner_uid)
    return True
