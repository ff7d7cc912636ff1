"""What a raised exception means by its type and errno, whatever its message says.

Phrases describe the messages someone has already seen; a framework's next version words them
differently. The exception's type and the operating system's error number do not change: an
``OSError`` with errno 28 is a full disk whichever library raised it and however it phrased it,
a ``torch.OutOfMemoryError`` is the GPU's memory and Ray's ``OutOfMemoryError`` the host's. So
the last line of a traceback is parsed (module, type, the type a wrapper names, message,
errno) and looked up in two tables; a type or errno the tables do not know means nothing here,
and the phrase signatures and the generic "application exception" decide as before.

The tables hold only meanings documented by their owners: errno values from ``errno.h`` (Linux
numbering, as Python reports them), exception types from the frameworks' API references.
"""

from __future__ import annotations

import errno as errno_codes
from dataclasses import dataclass

from recovery.detection.linear_regex import compile_linear
from recovery.detection.taxonomy import Attribution, FailureCategory

# "module.sub.TypeName(Wrapped): message": Python's final traceback line. Ray prints the type it
# wraps in brackets ("ray.exceptions.RayTaskError(OutOfMemoryError): ..."). A name that does not
# end like an exception's is not taken for one ("Note: ...", "Epoch: 3").
_EXCEPTION_LINE = compile_linear(
    r"^((?:[A-Za-z_][A-Za-z0-9_]*\.){0,12})"
    r"([A-Za-z_][A-Za-z0-9_]*(?:Error|Exception|Exit|Interrupt|Failure|Fault))"
    r"(?:\(([A-Za-z_][A-Za-z0-9_.]*)\))?(?: \(see above for traceback\))?(?::[ \t]?(.*))?$"
)
_ERRNO = compile_linear(r"\[Errno (\d{1,4})\]|^OSError\((\d{1,4}), |\berrno[ =:]+(\d{1,4})\b")
# What a distributed runtime raised, or its message names: a socket error there is the fabric
# between ranks, not a download the program made.
_DISTRIBUTED = compile_linear(
    r"(?i)torch\.distributed|\bc10d\b|\bgloo\b|\bnccl\b|rendezvous|TCPStore|ProcessGroup|"
    r"MASTER_ADDR|\bhorovod\b|\bmpi\b"
)


@dataclass(frozen=True)
class RaisedException:
    """One exception line: ``module.Name(Wrapped): message``."""

    module: str
    name: str
    wrapped: str
    message: str
    errno: int | None

    @property
    def qualified_name(self) -> str:
        return f"{self.module}.{self.name}" if self.module else self.name


@dataclass(frozen=True)
class Meaning:
    category: FailureCategory
    attribution: Attribution
    why: str


def parse_exception_line(message: str) -> RaisedException | None:
    """The exception a traceback's last line names, or None if the line is not one."""
    text = message.strip()[:2000]
    # JAX re-raises with its own frames filtered out, naming the original after its wrapper.
    text = text.removeprefix("jax._src.traceback_util.UnfilteredStackTrace: ")
    found = _EXCEPTION_LINE.search(text)
    if found is None:
        return None
    number = _ERRNO.search(message[:2000])
    code = next((int(group) for group in number.groups() if group), None) if number else None
    return RaisedException(
        module=found.group(1).rstrip("."),
        name=found.group(2),
        wrapped=(found.group(3) or "").rsplit(".", 1)[-1],
        message=found.group(4) or "",
        errno=code,
    )


_STORAGE = (FailureCategory.STORAGE_IO, Attribution.SYSTEM_SOFTWARE)
_HOST_MEMORY = (FailureCategory.HOST_OOM, Attribution.APPLICATION)
_FABRIC = (FailureCategory.INTERCONNECT, Attribution.SYSTEM_SOFTWARE)

# errno -> meaning, for errors a filesystem or the kernel's allocator returns.
ERRNO_MEANINGS: dict[int, tuple[FailureCategory, Attribution, str]] = {
    errno_codes.ENOSPC: (*_STORAGE, "no space left on the device (ENOSPC)"),
    errno_codes.EDQUOT: (*_STORAGE, "disk quota exceeded (EDQUOT)"),
    errno_codes.EIO: (*_STORAGE, "input/output error (EIO)"),
    errno_codes.ESTALE: (*_STORAGE, "stale file handle (ESTALE): the file server lost it"),
    errno_codes.EROFS: (*_STORAGE, "read-only file system (EROFS)"),
    errno_codes.EMFILE: (*_STORAGE, "too many open files in the process (EMFILE)"),
    errno_codes.ENFILE: (*_STORAGE, "too many open files in the system (ENFILE)"),
    errno_codes.EREMOTEIO: (*_STORAGE, "remote I/O error (EREMOTEIO)"),
    errno_codes.EUCLEAN: (*_STORAGE, "file system structure needs cleaning (EUCLEAN)"),
    errno_codes.EFBIG: (*_STORAGE, "file too large for the file system (EFBIG)"),
    errno_codes.ENOMEM: (*_HOST_MEMORY, "the kernel could not allocate memory (ENOMEM)"),
}

# errno -> meaning, for sockets, only where a distributed runtime raised the error.
DISTRIBUTED_ERRNO_MEANINGS: dict[int, tuple[FailureCategory, Attribution, str]] = {
    errno_codes.ECONNRESET: (*_FABRIC, "connection reset by the peer rank (ECONNRESET)"),
    errno_codes.ECONNREFUSED: (*_FABRIC, "connection to a rank refused (ECONNREFUSED)"),
    errno_codes.ETIMEDOUT: (*_FABRIC, "connection to a rank timed out (ETIMEDOUT)"),
    errno_codes.EHOSTUNREACH: (*_FABRIC, "no route to a rank's host (EHOSTUNREACH)"),
    errno_codes.ENETUNREACH: (*_FABRIC, "network unreachable (ENETUNREACH)"),
    errno_codes.EPIPE: (*_FABRIC, "a rank closed its connection (EPIPE)"),
}

# Exception type -> meaning, by the type's own name; ``(module prefix, name)`` entries first.
QUALIFIED_TYPE_MEANINGS: dict[tuple[str, str], tuple[FailureCategory, Attribution, str]] = {
    # Ray's memory monitor kills a task when the node runs low on host memory.
    ("ray", "OutOfMemoryError"): (*_HOST_MEMORY, "Ray killed a task: the node ran low on memory"),
}
TYPE_MEANINGS: dict[str, tuple[FailureCategory, Attribution, str]] = {
    "OutOfMemoryError": (
        FailureCategory.GPU_OOM,
        Attribution.APPLICATION,
        "the GPU's memory is exhausted (torch.OutOfMemoryError)",
    ),
    "ResourceExhaustedError": (
        FailureCategory.GPU_OOM,
        Attribution.APPLICATION,
        "TensorFlow could not allocate a tensor (ResourceExhaustedError)",
    ),
    "MemoryError": (*_HOST_MEMORY, "Python could not allocate host memory (MemoryError)"),
    "FloatingPointError": (
        FailureCategory.NAN_DIVERGENCE,
        Attribution.APPLICATION,
        "a floating-point check found a value that is not finite (FloatingPointError)",
    ),
    # CuPy's and Alpa's NCCL binding (cupy.cuda.nccl.NcclError).
    "NcclError": (
        FailureCategory.NCCL_ERROR,
        Attribution.UNKNOWN,
        "an NCCL call failed (NcclError)",
    ),
    "DistBackendError": (
        FailureCategory.NCCL_ERROR,
        Attribution.UNKNOWN,
        "the collective backend failed (torch.distributed.DistBackendError)",
    ),
}
# XLA status codes that open the message of an XLA runtime error (JAX, TensorFlow on XLA).
XLA_STATUS_MEANINGS: dict[str, tuple[FailureCategory, Attribution, str]] = {
    "RESOURCE_EXHAUSTED": (
        FailureCategory.GPU_OOM,
        Attribution.APPLICATION,
        "XLA could not allocate device memory (RESOURCE_EXHAUSTED)",
    ),
    # The coordination service's barrier or a collective that did not complete in time.
    "DEADLINE_EXCEEDED": (
        FailureCategory.NCCL_TIMEOUT,
        Attribution.UNKNOWN,
        "a distributed barrier or collective timed out (DEADLINE_EXCEEDED)",
    ),
}


def meaning_of(raised: RaisedException) -> Meaning | None:
    """What the exception means by its type, the type it wraps, or its errno; None if nothing."""
    for name in (raised.wrapped, raised.name):
        if not name:
            continue
        for (prefix, typed), known in QUALIFIED_TYPE_MEANINGS.items():
            if typed == name and raised.module.split(".", 1)[0] == prefix:
                return Meaning(*known)
        if name in TYPE_MEANINGS:
            return Meaning(*TYPE_MEANINGS[name])
    status = raised.message.split(":", 1)[0].strip()
    if status in XLA_STATUS_MEANINGS:
        return Meaning(*XLA_STATUS_MEANINGS[status])
    if raised.errno is not None:
        if raised.errno in ERRNO_MEANINGS:
            return Meaning(*ERRNO_MEANINGS[raised.errno])
        distributed = _DISTRIBUTED.search(f"{raised.qualified_name}: {raised.message}")
        if distributed is not None and raised.errno in DISTRIBUTED_ERRNO_MEANINGS:
            return Meaning(*DISTRIBUTED_ERRNO_MEANINGS[raised.errno])
    return None
