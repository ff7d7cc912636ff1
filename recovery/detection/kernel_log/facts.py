"""What a kernel log reads as: device and process facts, the lines of known structure that
report none, and what one read of a log holds.

Kept apart from the patterns that find them: what reads the facts (the loop, the tests)
needs only these types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from recovery.detection.taxonomy import Attribution


class ProcessEvent(StrEnum):
    """What a process line reports."""

    SEGFAULT = "segfault"
    TRAP = "trap"
    OOM_SUMMARY = "oom_summary"
    OOM_KILLED = "oom_killed"
    OOM_INVOKED = "oom_invoked"
    APPLICATION_XID = "application_xid"


OOM_EVENTS = frozenset(
    {ProcessEvent.OOM_SUMMARY, ProcessEvent.OOM_KILLED, ProcessEvent.OOM_INVOKED}
)


class Shape(StrEnum):
    """A line of a known structure that reports no fact."""

    # A driver's own context line ("NVRM: GPU at PCI:...", "nvidia 0000:3b:00.0: enabling ...").
    DEVICE = "device"
    # A process line that states nothing of its own (the OOM reaper's note): it carries user
    # text all the same.
    PROCESS = "process"


@dataclass(frozen=True)
class DeviceFact:
    """What a device's driver reported about the device.

    ``device`` is the PCI address, memory controller or CPU the driver names; ``message`` the
    message as printed (shown, never matched again).
    """

    signature: str
    category: str
    attribution: str
    severity: str
    device: str
    message: str
    detail: dict[str, Any] = field(default_factory=dict)
    discriminator: str = ""

    @property
    def hardware(self) -> bool:
        """A fact about the node's hardware: the only kind that acts beyond one job."""
        return self.attribution == Attribution.HARDWARE


@dataclass(frozen=True)
class ProcessFact:
    """What happened to one process, as a process line reports it.

    ``comm`` is the process name, the tenant's own text (shown, never matched). ``job_id`` is
    the Slurm job whose cgroup the line names, ``uid`` the process owner the kernel printed.
    """

    signature: str
    event: ProcessEvent
    category: str
    attribution: str
    severity: str
    message: str
    pid: int | None = None
    comm: str = ""
    job_id: str | None = None
    uid: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    discriminator: str = ""


Fact = DeviceFact | ProcessFact


@dataclass(frozen=True)
class KernelEntry:
    """A fact and where it is in the read: its line (1-based) and its time, when printed."""

    line: int
    fact: Fact
    at: datetime | None = None


@dataclass
class KernelRead:
    """What one read of a kernel log holds.

    ``entries`` are the facts of lines read as messages of their own. ``in_continuations`` are
    the facts lines read as continuations of a record before them would have given, and
    ``not_from_kernel`` those of syslog lines another program wrote: never used, kept to say
    what was ignored.
    """

    entries: list[KernelEntry] = field(default_factory=list)
    in_continuations: list[KernelEntry] = field(default_factory=list)
    not_from_kernel: list[KernelEntry] = field(default_factory=list)
    lines: int = 0
    continuations: int = 0
    foreign: int = 0
