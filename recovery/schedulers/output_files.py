"""Reading a job's output files with the job's rights, not the service's.

A job names its own output files (``sbatch -o``, ``--chdir``), and the poller reads them with
the rights of the service, which may read every user's files; what it reads ends up as evidence
every Console viewer sees. So an output file is read only when all of this holds:

* its path is absolute, without ``..``, and lies inside the job's working directory or one of
  the cluster's ``output_prefixes``, compared by whole path components (``/scratch/a`` does not
  admit ``/scratch/ab``); ``/`` itself confines nothing and admits nothing;
* no component of the path is a symbolic link, the directories the path starts with included;
* it is a regular file (not a directory, FIFO, socket or device), owned by the job's user, whose
  uid the scheduler reported. With the uid unknown nothing is read: it is never assumed.

Otherwise ``OutputRefused`` names the rule (``reason``) and what broke it (``detail``). Both
transports apply these rules: ``open_local_output`` here walks the path one directory at a time
with ``openat`` and ``O_NOFOLLOW``; the SSH transport, which has no ``openat`` over SFTP, checks
each component with ``lstat`` and the opened file again (see ``SSHTransport.open_outputs``).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from recovery.schedulers.compat import StrEnum

logger = logging.getLogger(__name__)

# Slurm's NO_VAL: the uid field of a record whose user was never set.
_NO_UID = 0xFFFFFFFE
READ_CHUNK = 1024 * 1024


class OutputRefusal(StrEnum):
    """Why a job's output file was not read. Stored in the audit trail: values must not change."""

    OWNER_UNKNOWN = "owner unknown"
    BAD_PATH = "not a plain absolute path"
    OUTSIDE = "outside the job's directories"
    SYMLINK = "symbolic link"
    NOT_A_FILE = "not a regular file"
    OTHER_OWNER = "owned by another user"
    UNREADABLE = "cannot be opened"


class OutputRefused(Exception):
    """A job's output file that the rules above do not let the poller read."""

    def __init__(self, reason: OutputRefusal, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class OutputFile(Protocol):
    """An output file opened under the rules: its size when opened, and reads from an offset."""

    size: int

    def read(self, offset: int, limit: int) -> bytes:
        """Up to ``limit`` bytes from ``offset``; fewer at the end of the file."""
        ...

    def close(self) -> None: ...


class PrefetchedOutput:
    """An output file read ahead when it was opened, and closed since.

    ``size`` is its size when it was opened and ``data`` its bytes from ``start`` on: up to
    ``size``, or fewer when the read-ahead was bounded or stopped early. A read that ``data``
    answers (inside it, or running past its end where that end is ``size``) is served from it;
    any other opens the file again, under the same rules, through ``reread(offset, limit)``.
    Keeping no file open lets one batch open more files than a process may hold at once.
    """

    def __init__(
        self, size: int, start: int, data: bytes, reread: Callable[[int, int], bytes]
    ) -> None:
        self.size = size
        self.start = start
        self._data: bytes | None = data
        self._reread = reread

    @property
    def prefetched(self) -> bytes:
        if self._data is None:
            raise ValueError("read of a closed output file")
        return self._data

    def read(self, offset: int, limit: int) -> bytes:
        data = self.prefetched
        end = self.start + len(data)
        if self.start <= offset and (offset + limit <= end or end >= self.size):
            begin = offset - self.start
            return data[begin : begin + max(limit, 0)]
        return self._reread(offset, limit)

    def close(self) -> None:
        self._data = None


def valid_uid(value: int) -> bool:
    """Whether ``value`` can be a user's uid (not negative, not Slurm's "never set")."""
    return 0 <= value < _NO_UID


def path_components(path: str) -> tuple[str, ...]:
    """The names in an absolute path, ``.`` and repeated slashes dropped; refuses the rest."""
    if "\x00" in path:
        raise OutputRefused(OutputRefusal.BAD_PATH, f"{path!r} holds a NUL byte")
    if not path.startswith("/"):
        raise OutputRefused(OutputRefusal.BAD_PATH, f"{path!r} is not an absolute path")
    names = tuple(name for name in path.split("/") if name not in ("", "."))
    if ".." in names:
        raise OutputRefused(OutputRefusal.BAD_PATH, f"{path} has a '..' component")
    return names


def joined(names: Iterable[str]) -> str:
    return "/" + "/".join(names)


@dataclass(frozen=True)
class OutputAccess:
    """Whose a job's output files must be, and the directories they must lie in.

    ``directories`` are the job's working directory (as the scheduler reports it) and the
    prefixes an administrator allowed for the cluster. One that is empty, relative, holds ``..``
    or is ``/`` admits nothing.
    """

    owner_uid: int | None
    directories: tuple[str, ...] = ()

    def roots(self) -> list[tuple[str, ...]]:
        roots = []
        for directory in self.directories:
            if not directory:
                continue
            try:
                names = path_components(directory)
            except OutputRefused as refused:
                logger.warning("not a directory output files may lie in: %s", refused.detail)
                continue
            if names:
                roots.append(names)
        return roots

    def admit(self, path: str) -> tuple[str, ...]:
        """The components of ``path`` if its place and the owner's uid allow reading it.

        Only the path is checked here; the file itself is checked where it is opened.
        """
        names = path_components(path)
        roots = self.roots()
        if not any(len(names) > len(root) and names[: len(root)] == root for root in roots):
            allowed = ", ".join(joined(root) for root in roots) or "none"
            raise OutputRefused(
                OutputRefusal.OUTSIDE,
                f"{joined(names)} is outside the job's working directory and the cluster's "
                f"output prefixes (allowed: {allowed})",
            )
        if self.owner_uid is None or not valid_uid(self.owner_uid):
            raise OutputRefused(
                OutputRefusal.OWNER_UNKNOWN,
                "the scheduler did not report the uid of the job's user, so no file can be "
                "checked to be that user's",
            )
        return names


def access_for(access: OutputAccess | Mapping[str, OutputAccess], path: str) -> OutputAccess:
    """The rules for ``path`` when a batch gives one set for all its files or one per file."""
    return access if isinstance(access, OutputAccess) else access[path]


def check_file(path: str, mode: int | None, uid: int | None, owner_uid: int) -> None:
    """Refuses anything but a regular file of ``owner_uid`` (``mode``/``uid`` as stat gives)."""
    if mode is None:
        raise OutputRefused(OutputRefusal.NOT_A_FILE, f"{path}: its file type was not reported")
    if stat.S_ISLNK(mode):
        raise OutputRefused(OutputRefusal.SYMLINK, f"{path} is a symbolic link")
    if not stat.S_ISREG(mode):
        raise OutputRefused(
            OutputRefusal.NOT_A_FILE, f"{path} is {_file_kind(mode)}, not a regular file"
        )
    if uid is None:
        raise OutputRefused(OutputRefusal.OWNER_UNKNOWN, f"{path}: its owner was not reported")
    if uid != owner_uid:
        raise OutputRefused(
            OutputRefusal.OTHER_OWNER,
            f"{path} belongs to uid {uid}, but the job runs as uid {owner_uid}",
        )


def _file_kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    return next((name for test, name in kinds if test(mode)), "of an unknown type")


def cannot_open(path: str, error: OSError) -> OutputRefused:
    return OutputRefused(
        OutputRefusal.UNREADABLE, f"{path} cannot be opened: {error.strerror or error}"
    )


# ---------------------------------------------------------------------- on this host


class LocalOutput:
    """A local output file open for reading; reads do not move a shared position."""

    def __init__(self, fd: int, size: int) -> None:
        self._fd = fd
        self.size = size

    def read(self, offset: int, limit: int) -> bytes:
        chunks = []
        while limit > 0:
            data = os.pread(self._fd, min(limit, READ_CHUNK), offset)
            if not data:
                break
            chunks.append(data)
            offset += len(data)
            limit -= len(data)
        return b"".join(chunks)

    def close(self) -> None:
        os.close(self._fd)


_DIRECTORY_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def open_local_output(path: str, access: OutputAccess) -> LocalOutput | None:
    """The output file at ``path`` opened under the rules, or None when it does not exist.

    Each directory is opened relative to the one before it without following a link, so a link
    anywhere is refused and no component can be swapped for one half-way. The file is looked at
    through an ``O_PATH`` descriptor before it is opened for reading, so a device is never
    opened, and checked again once open (``O_NONBLOCK``: a FIFO swapped in cannot block).
    """
    names = access.admit(path)
    assert access.owner_uid is not None  # admit() refuses an unknown owner
    shown = joined(names)
    directory = os.open("/", _DIRECTORY_FLAGS)
    try:
        for depth, name in enumerate(names[:-1], start=1):
            try:
                inner = os.open(name, _DIRECTORY_FLAGS, dir_fd=directory)
            except FileNotFoundError:
                return None
            except OSError as error:
                where = joined(names[:depth])
                if error.errno in (errno.ELOOP, errno.ENOTDIR):
                    if _is_link(name, directory):
                        raise OutputRefused(
                            OutputRefusal.SYMLINK, f"{where} is a symbolic link"
                        ) from None
                    return None  # a file where a directory should be: the output cannot exist
                raise cannot_open(where, error) from None
            os.close(directory)
            directory = inner
        fd = _open_checked(names[-1], directory, shown, access.owner_uid)
    finally:
        os.close(directory)
    if fd is None:
        return None
    return LocalOutput(fd, os.fstat(fd).st_size)


def _open_checked(name: str, directory: int, shown: str, owner_uid: int) -> int | None:
    try:
        probe = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise cannot_open(shown, error) from None
    try:
        seen = os.fstat(probe)
    finally:
        os.close(probe)
    check_file(shown, seen.st_mode, seen.st_uid, owner_uid)
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=directory)
    except FileNotFoundError:
        return None
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise OutputRefused(OutputRefusal.SYMLINK, f"{shown} is a symbolic link") from None
        raise cannot_open(shown, error) from None
    try:
        opened = os.fstat(fd)
        check_file(shown, opened.st_mode, opened.st_uid, owner_uid)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_link(name: str, directory: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode)
    except OSError:
        return False
