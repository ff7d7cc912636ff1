"""A node's kernel log read as the kernel writes it: each message by its emitting subsystem's
own structure, anchored at the start of the message, field by field.

The kernel prints text a tenant chooses: a process name (``comm``, 15 characters, which any
program sets with ``prctl(PR_SET_NAME)``) at the start of segfault and OOM-killer lines and in
the NVIDIA driver's ``name=`` field, the file name of a faulting library after `` in ``, the
cgroup paths of the OOM killer's summary. So a message is recognised only by the structure its
driver prints, from its first character: the NVIDIA driver's ``NVRM: Xid (PCI:<bdf>): <code>,``
with a hexadecimal PCI address and the code before any user text, the PCI core's
``<driver> <bdf>: ...`` prefix, ``EDAC MC<n>: <count> UE ...``, ``mce: [Hardware Error]: ...``.
Nothing in a user-controlled field is ever matched against a hardware pattern, and a node name
found in the text is never read: the node a fact is about is the host whose log it is.

Two kinds of facts come out:

* **Device facts** (``DeviceFact``): what a device's driver reported about the device (an Xid
  decided by its code, an uncorrectable PCIe error, an uncorrectable memory error, a NIC's
  firmware failing). Those attributed to the hardware are facts about the node.
* **Process facts** (``ProcessFact``): what happened to one process (the OOM killer, a
  segfault, a general protection fault, an Xid whose meaning is the application's fault). They
  explain that process's job, and name it only where the line carries Slurm's cgroup path
  (``job_<id>``, the outermost component, which slurmstepd creates); they never implicate a
  node.

A process line is read as a process line even when its user text looks like something else:
its first fields are the kernel's (``<comm>[<pid>]: segfault at``, ``traps: <comm>[<pid>]``,
``Out of memory: Killed process <pid> (<comm>)``), so the user's 15 characters cannot complete
a hardware structure, and the process reading is tried first.

A file or cgroup name may contain a newline. The kernel then prints one record as several
lines: through ``syslog(2)`` (``/proc/kmsg``, rsyslog's imklog) each gets the record's own
timestamp prefix; journalctl and dmesg indent them. A line indented before any prefix, or
carrying the same kernel timestamp as the line before it when that line carries user text (a
process line, or a line no structure here recognises), is a continuation of that record and is
never read as a message of its own, up to the size of one printk record. Logs without the
kernel's timestamps (``printk.time=0``, ``journalctl -o cat``) keep only part of that
protection: after a process line the next record's worth of text is still a continuation.

Syslog lines whose tag is not ``kernel`` are not the kernel's and are skipped. A syslog file
(``/var/log/kern.log``, ``/var/log/messages``) still accepts any local program's message with
facility ``kern`` and tag ``kernel`` (``logger -p kern.err -t kernel``): read the kernel's own
records (``journalctl -k`` or ``/dev/kmsg``), not such a file, where tenants run programs.

Every pattern here runs on RE2 (``compile_linear``), so its time is linear in the line.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

import re2

from recovery.detection.facts.xid import XID_MEANINGS, xid_meaning
from recovery.detection.findings import CRASH, Finding, FindingSource
from recovery.detection.linear_regex import compile_linear
from recovery.detection.normalize import MAX_MESSAGE_CHARS, parse_timestamp
from recovery.detection.signatures.base import CATEGORY_PRIORITY, CAUSE
from recovery.detection.taxonomy import NO_CATEGORY, Attribution, FailureCategory, Severity

# A printk record holds at most 1024 bytes of text (PRINTKRB_RECORD_MAX, kernel/printk); twice
# that bounds how far a record's continuation lines reach, whatever the log's prefixes.
MAX_RECORD_CHARS = 2048
MAX_EVIDENCE_CHARS = 1000
# Uncorrectable host memory and CPU errors: below a GPU off the bus, above the fabric.
HOST_HARDWARE_PRIORITY = 95

_HEX = "[0-9a-fA-F]"
# The NVIDIA driver's "PCI:%04x:%02x:%02x" (domain, bus, device) and the PCI core's device
# name "%04x:%02x:%02x.%d" (with the function).
_XID_BDF = f"{_HEX}{{4}}:{_HEX}{{2}}:{_HEX}{{2}}"
_PCI_NAME = f"{_XID_BDF}\\.[0-7]"


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


# ----------------------------------------------------------------------------- line prefixes


@dataclass(frozen=True)
class Prefix:
    """What a line's prefixes say, and the message after them.

    ``record`` is the kernel's own timestamp (``[87430.975714]``): the lines of one printk
    record share it. ``clock`` is a syslog or journal time, to the second. ``foreign`` is a
    syslog line another program wrote; ``indented`` a line that starts with white space
    before any prefix (how journalctl and dmesg print a record's further lines).
    """

    message: str
    record: str | None = None
    clock: str | None = None
    at: datetime | None = None
    foreign: bool = False
    indented: bool = False

    @property
    def key(self) -> str | None:
        """What the lines of one record have in common: the kernel's time, else the clock's."""
        return self.record if self.record is not None else self.clock


# Each prefix is matched at the start of what is left of the line, in this order.
_PRIORITY = compile_linear(r"<[0-9]{1,3}>")
_FACILITY = compile_linear(r"kern *:[a-z]{1,8} *: ")  # dmesg -x
_SYSLOG_TIME = compile_linear(
    r"([A-Z][a-z]{2} [ 0-9][0-9] [0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?) "
)
_ISO_TIME = compile_linear(
    r"([0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]{1,9})?"
    r"(?:Z|[+-][0-9]{2}:?[0-9]{2})?) "
)
_CTIME = compile_linear(  # dmesg -T
    r"\[([A-Z][a-z]{2} [A-Z][a-z]{2} [ 0-9][0-9] [0-9]{2}:[0-9]{2}:[0-9]{2} [0-9]{4})\] "
)
_KERNEL_TIME = compile_linear(r"\[ *([0-9]{1,10}\.[0-9]{1,9})\] ?")
_CALLER = compile_linear(r"\[ *[TC][0-9]{1,7}\] ?")  # CONFIG_PRINTK_CALLER
# A syslog header after its time: host, then the program's tag.
_SYSLOG_SOURCE = compile_linear(
    r"[A-Za-z0-9][A-Za-z0-9._-]{0,252} ([A-Za-z0-9_./-]{1,64}?)(?:\[[0-9]{1,10}\])?: "
)
# journalctl -o short-monotonic after its time, and a bare "host kernel: " or "kernel: ".
_KERNEL_SOURCE = compile_linear(r"(?:[A-Za-z0-9][A-Za-z0-9._-]{0,252} )?kernel: ")


def peel(line: str) -> Prefix:
    """The message of ``line`` and what its dmesg, syslog or journal prefixes say."""
    text = line.rstrip("\r\n")[:MAX_MESSAGE_CHARS]
    if text[:1] in (" ", "\t"):
        return Prefix(message=text.strip(), indented=True)
    record: str | None = None
    clock: str | None = None
    at: datetime | None = None
    # Each pattern is tried only where the line's first character allows it: a line goes
    # through few of them, and they run on every line of every node's log.
    if text.startswith("<"):
        text = _drop(_PRIORITY, text)
    if text.startswith("kern "):
        text = _drop(_FACILITY, text)
    first = text[:1]
    found: re2._Match[str] | None = None
    syslog = False
    if first.isupper():
        if (found := _SYSLOG_TIME.match(text)) is not None:
            clock, syslog = found.group(1), True
    elif first.isdigit():
        if (found := _ISO_TIME.match(text)) is not None:
            clock, syslog = found.group(1), True
            at = parse_timestamp(clock)
    elif first == "[":
        if text[1:2].isalpha():
            if (found := _CTIME.match(text)) is not None:
                clock = found.group(1)
        elif (found := _KERNEL_TIME.match(text)) is not None:
            record = found.group(1)
    if found is not None:
        text = text[found.end() :]
    if syslog:
        source = _SYSLOG_SOURCE.match(text)
        if source is not None:
            text = text[source.end() :]
            if source.group(1) != "kernel":
                return Prefix(message=text, clock=clock, at=at, foreign=True)
    elif "kernel: " in text[:270]:
        text = _drop(_KERNEL_SOURCE, text)
    if text.startswith("["):
        if record is None and (found := _KERNEL_TIME.match(text)) is not None:
            record = found.group(1)
            text = text[found.end() :]
        text = _drop(_CALLER, text)
    return Prefix(message=text, record=record, clock=clock, at=at)


def _drop(pattern: re2._Regexp[str], text: str) -> str:
    found = pattern.match(text)
    return text if found is None else text[found.end() :]


# ----------------------------------------------------------------------------- process lines
# Tried before any hardware structure: their first fields are the kernel's, and the user's
# text follows them.

# arch/x86/mm/fault.c show_signal_msg: "%s[%d]: segfault at %lx ip %px sp %px error %lx",
# then " in <file>[...]" (print_vma_addr) and, since 6.1, " likely on CPU %d (core %d, ...)".
_SEGFAULT = compile_linear(
    r"(.{0,15}?)\[([0-9]{1,10})\]: segfault at [0-9a-f]{1,16} ip [0-9a-f]{1,16} "
    r"sp [0-9a-f]{1,16} error [0-9a-f]{1,8}"
)
# arch/x86/kernel/traps.c (pr_fmt "traps: "): "%s[%d] general protection fault ip:%lx sp:%lx
# error:%lx" (before 5.x "general protection ip:"), and do_trap's "%s[%d] trap %s ip:...".
_TRAP = compile_linear(
    r"traps: (.{0,15}?)\[([0-9]{1,10})\] (general protection(?: fault)?|trap [a-z0-9 ]{1,40}?) "
    r"ip:[0-9a-f]{1,16} sp:[0-9a-f]{1,16} error:[0-9a-f]{1,8}"
)
# mm/oom_kill.c __oom_kill_process: "%s: Killed process %d (%s) total-vm:..." with "Out of
# memory" or "Memory cgroup out of memory"; before 4.19 "Kill process %d (%s) score ...".
_OOM_KILLED = compile_linear(
    r"(?:Out of memory(?: \(oom_kill_allocating_task\))?|Memory cgroup out of memory): "
    r"Kill(?:ed)? process ([0-9]{1,10}) \((.{0,15}?)\)(?: |,|$)"
)
# mm/oom_kill.c dump_header: "%s invoked oom-killer: gfp_mask=%#x(%pGg), order=%d, ...".
_OOM_INVOKED = compile_linear(r"(.{0,15}?) invoked oom-killer: gfp_mask=0x[0-9a-f]{1,16}")
# mm/oom_kill.c dump_oom_summary (4.19 on): "oom-kill:constraint=%s,nodemask=%*pbl" then
# ",cpuset=<path>,mems_allowed=<list>", ",oom_memcg=<path>" or ",global_oom",
# ",task_memcg=<path>", ",task=%s,pid=%d,uid=%d". The paths are cgroup names, which may hold
# any character but "/": only their start, which the site's daemons create, is read.
_OOM_SUMMARY = compile_linear(r"oom-kill:constraint=(CONSTRAINT_[A-Z_]{1,20}),nodemask=")
_OOM_SUMMARY_END = compile_linear(r",task=(.{0,15}),pid=([0-9]{1,10}),uid=([0-9]{1,10})$")
# mm/oom_kill.c oom_reap_task_mm: "oom_reaper: reaped process %d (%s), now anon-rss:...".
_OOM_REAPED = compile_linear(r"oom_reaper: reaped process [0-9]{1,10} \(")
# The job cgroups slurmstepd creates: cgroup v1 (proctrack/task cgroup plugins)
# "/slurm[_<node>]/uid_<uid>/job_<id>/...", cgroup v2 (cgroup/v2 plugin)
# "/system.slice/[<node>_]slurmstepd.scope/job_<id>/...". The first job_<id> is Slurm's:
# anything below it a job's processes may have created themselves.
_SLURM_V1_JOB = compile_linear(
    r"/slurm(?:_[A-Za-z0-9._-]{1,64})?/uid_([0-9]{1,10})/job_([0-9]{1,10})(?:/|,)"
)
_SLURM_V2_JOB = compile_linear(
    r"/system\.slice/(?:[A-Za-z0-9._-]{1,64}_)?slurmstepd\.scope/job_([0-9]{1,10})(?:/|,)"
)

# ----------------------------------------------------------------------------- device lines

# NVIDIA driver, src/nvidia/src/kernel/gpu/rc/kernel_rc.c krcReportXid:
# "NVRM: Xid (PCI:%04x:%02x:%02x[ GPU-I:%02u[ GPU-CI:%02u]]): %d, pid=%s, name=%s, %s";
# older drivers print "pid=%d, <message>" or no pid at all. The code comes before any user text.
_XID = compile_linear(
    rf"NVRM: Xid \(PCI:({_XID_BDF})(?: GPU-I:([0-9]{{1,5}}))?(?: GPU-CI:([0-9]{{1,5}}))?\): "
    r"([0-9]{1,5}), (?:pid=([0-9]{1,10}|'<unknown>'), )?"
)
# NVIDIA driver, kernel-open/nvidia/nv.c and arch/nvalloc/unix (NV_DEV_PRINTF prefix
# "NVRM: GPU %04x:%02x:%02x.%x: "): "GPU has fallen off the bus.", "RmInitAdapter failed!
# (0x%x:0x%x:%d)", "rm_init_adapter failed, device minor number %d"; older drivers print
# "NVRM: RmInitAdapter failed! (...)" without the address.
_NVRM_GPU = compile_linear(rf"NVRM: GPU ({_PCI_NAME}): ")
_GPU_OFF_BUS = compile_linear(r"GPU has fallen off the bus")
_RM_INIT_FAILED = compile_linear(
    r"(?:RmInitAdapter failed! \(0x[0-9a-fA-F]{1,8}:0x[0-9a-fA-F]{1,8}:[0-9]{1,6}\)|"
    r"rm_init_adapter failed, device minor number [0-9]{1,4})"
)
_NVRM_INIT_FAILED = compile_linear(
    r"NVRM: RmInitAdapter failed! \(0x[0-9a-fA-F]{1,8}:0x[0-9a-fA-F]{1,8}:[0-9]{1,6}\)"
)
# krcReportXid's _krcLogUuidOnce: "NVRM: GPU at PCI:%04x:%02x:%02x: %s", "NVRM: GPU Board
# Serial Number: %s": the driver's own context lines.
_NVRM_CONTEXT = compile_linear(rf"NVRM: GPU (?:at PCI:{_XID_BDF}: |Board Serial Number: )")
# The NVSwitch driver (src/common/nvswitch): "nvidia-nvswitch%d: SXid (PCI:%04x:%02x:%02x.%x):
# %05d, Fatal|Non-fatal, ...".
_SXID = compile_linear(
    rf"nvidia-nvswitch([0-9]{{1,3}}): SXid \(PCI:({_PCI_NAME})\): ([0-9]{{1,6}}), "
    r"(Fatal|Non-fatal), "
)
# dev_printk for a PCI device: "<driver> <domain:bus:dev.fn>: " (the driver's name, or "pci"
# when none is bound), with a network interface's name after it for netdev_printk.
_PCI_DEVICE = compile_linear(rf"([a-z][a-z0-9_-]{{0,31}}) ({_PCI_NAME})(?: ([^ :/]{{1,15}}))?: ")
# drivers/pci/pcie/aer.c (dev_fmt "AER: " since 4.19): "PCIe Bus Error: severity=%s, type=..."
# and the root port's "%s%s error received: %04x:%02x:%02x.%d" ("error message received from"
# in 6.x). Since 6.6 the severities read "Correctable" and "Uncorrectable (...)".
_AER_SEVERITY = (
    r"(Corrected|Correctable|Uncorrected \(Non-Fatal\)|Uncorrected \(Fatal\)|"
    r"Uncorrectable \(Non-Fatal\)|Uncorrectable \(Fatal\))"
)
_AER = compile_linear(
    rf"(?:AER: )?(?:PCIe Bus Error: severity={_AER_SEVERITY}, type=|"
    rf"(?:Multiple )?{_AER_SEVERITY} error (?:message )?received(?::| from) )"
)
# drivers/pci/pcie/dpc.c (dev_fmt "DPC: "): "containment event, status:%#06x source:%#06x".
_DPC = compile_linear(r"DPC: containment event, status:0x[0-9a-f]{4} source:0x[0-9a-f]{4}")
# drivers/net/ethernet/mellanox/mlx5/core/health.c through mlx5_core_err, whose prefix is
# "%s:%d:(pid %d): " (function, line, the current pid): "Fatal error %u detected", "device's
# health compromised - reached miss count", "health recovery failed"; en_main.c's netdev
# "Link down".
_MLX5_CALLER = compile_linear(r"[A-Za-z0-9_]{1,64}:[0-9]{1,6}:\(pid [0-9]{1,10}\): ")
_MLX5_FATAL = compile_linear(r"Fatal error ([0-9]{1,3}) detected")
_MLX5_HEALTH = compile_linear(r"(?:device's health compromised|health recovery failed)")
_LINK_DOWN = compile_linear(r"Link down")
# drivers/edac/edac_mc.c edac_ue_error / edac_ce_error (edac_mc_printk: "EDAC MC%d: "):
# "%d UE %s%son %s (%s %s)" and "%d CE ...".
_EDAC = compile_linear(r"EDAC MC([0-9]{1,4}): ([0-9]{1,5}) (UE|CE) ")
# arch/x86/kernel/cpu/mce/core.c (pr_fmt "mce: ", HW_ERR "[Hardware Error]: "): __print_mce's
# "CPU %d: Machine Check%s: %Lx Bank %d: %016Lx" (the bank's MCi_STATUS, whose bit 61 says
# uncorrected), mce_notify_irq's "Machine check events logged", and kill_me_maybe's
# "Uncorrected hardware memory error in user-access at %llx".
_MCE_BANK = compile_linear(
    r"mce: \[Hardware Error\]: CPU ([0-9]{1,5}): Machine Check(?: Exception)?: "
    r"[0-9a-fA-F]{1,16} Bank ([0-9]{1,3}): ([0-9a-fA-F]{16})"
)
_MCE_LOGGED = compile_linear(r"mce: \[Hardware Error\]: Machine check events logged")
_MCE_USER_ACCESS = compile_linear(
    r"mce: Uncorrected hardware memory error in user-access at ([0-9a-fA-F]{1,16})"
)
_MCE_ANY = compile_linear(r"mce: ")
# mm/memory-failure.c (pr_fmt "Memory failure: "): "%#lx: recovery action for %s: %s", "%#lx:
# Sending SIGBUS to %s:%d due to hardware memory corruption": a page the hardware poisoned.
_MEMORY_FAILURE = compile_linear(r"Memory failure: 0x([0-9a-f]{1,16}): ")
_MCI_STATUS_UC = 1 << 61
_MCI_STATUS_PCC = 1 << 57

# What each structure is and who prints it, for the people reading a fact and for the tests.
PRINTED_BY: dict[str, str] = {
    "nvidia-xid": "the NVIDIA driver (src/nvidia/src/kernel/gpu/rc/kernel_rc.c, krcReportXid)",
    "gpu-fallen-off-bus": "the NVIDIA driver (NV_DEV_PRINTF, kernel-open/nvidia/nv.c)",
    "gpu-lost": "the NVIDIA driver (RmInitAdapter / rm_init_adapter, kernel-open/nvidia/nv.c)",
    "nvswitch-sxid": "the NVIDIA NVSwitch driver (src/common/nvswitch, SXid reports)",
    "pcie-aer-uncorrected": "the Linux PCIe AER driver (drivers/pci/pcie/aer.c)",
    "pcie-aer-corrected": "the Linux PCIe AER driver (drivers/pci/pcie/aer.c)",
    "pcie-dpc-containment": "the Linux PCIe DPC driver (drivers/pci/pcie/dpc.c)",
    "mlx5-fatal-error": "mlx5_core (drivers/net/ethernet/mellanox/mlx5/core/health.c)",
    "mlx5-health-compromised": "mlx5_core (drivers/net/ethernet/mellanox/mlx5/core/health.c)",
    "mlx5-link-down": "mlx5_core's Ethernet/IPoIB netdev (mlx5/core/en_main.c)",
    "edac-uncorrected": "the Linux EDAC core (drivers/edac/edac_mc.c, edac_ue_error)",
    "edac-corrected": "the Linux EDAC core (drivers/edac/edac_mc.c, edac_ce_error)",
    "mce-uncorrected": "the x86 machine-check handler (arch/x86/kernel/cpu/mce/core.c)",
    "mce-corrected": "the x86 machine-check handler (arch/x86/kernel/cpu/mce/core.c)",
    "memory-failure": "the kernel's hardware-poison handler (mm/memory-failure.c)",
    "segmentation-fault": "the x86 fault and trap handlers (arch/x86/mm/fault.c, traps.c)",
    "kernel-oom-killer": "the OOM killer (mm/oom_kill.c)",
}


def classify(message: str) -> Fact | Shape | None:
    """The fact ``message`` reports, the ``Shape`` of a known line that reports none, or None
    for a message no structure here recognises."""
    process = _process_fact(message)
    if process is not None:
        return process
    return _device_fact(message)


def _process_fact(message: str) -> ProcessFact | Shape | None:
    head = message[:48]
    if "]: segfault at " in head and (found := _SEGFAULT.match(message)) is not None:
        return _crash(message, ProcessEvent.SEGFAULT, found.group(1), int(found.group(2)))
    if message.startswith("traps: ") and (found := _TRAP.match(message)) is not None:
        return _crash(
            message,
            ProcessEvent.TRAP,
            found.group(1),
            int(found.group(2)),
            detail={"trap": found.group(3)},
        )
    if (
        message.startswith(("Out of memory", "Memory cgroup out of memory"))
        and (found := _OOM_KILLED.match(message)) is not None
    ):
        pid, comm = int(found.group(1)), found.group(2)
        return _oom(message, ProcessEvent.OOM_KILLED, pid=pid, comm=comm)
    if " invoked oom-killer: " in head and (found := _OOM_INVOKED.match(message)) is not None:
        return _oom(message, ProcessEvent.OOM_INVOKED, comm=found.group(1))
    if message.startswith("oom-kill:") and (found := _OOM_SUMMARY.match(message)) is not None:
        return _oom_summary(message, found.group(1))
    if message.startswith("oom_reaper: ") and _OOM_REAPED.match(message) is not None:
        return Shape.PROCESS
    return None


def _crash(
    message: str,
    event: ProcessEvent,
    comm: str,
    pid: int,
    *,
    detail: dict[str, Any] | None = None,
) -> ProcessFact:
    return ProcessFact(
        signature="segmentation-fault",
        event=event,
        category=FailureCategory.SEGFAULT,
        attribution=Attribution.UNKNOWN,
        severity=Severity.ERROR,
        message=message,
        pid=pid,
        comm=comm,
        detail=detail or {},
    )


def _oom(
    message: str,
    event: ProcessEvent,
    *,
    pid: int | None = None,
    comm: str = "",
    job_id: str | None = None,
    uid: int | None = None,
    detail: dict[str, Any] | None = None,
) -> ProcessFact:
    return ProcessFact(
        signature="kernel-oom-killer",
        event=event,
        category=FailureCategory.HOST_OOM,
        attribution=Attribution.APPLICATION,
        severity=Severity.ERROR,
        message=message,
        pid=pid,
        comm=comm,
        job_id=job_id,
        uid=uid,
        detail=detail or {},
    )


def _oom_summary(message: str, constraint: str) -> ProcessFact:
    end = _OOM_SUMMARY_END.search(message)
    pid = int(end.group(2)) if end is not None else None
    uid = int(end.group(3)) if end is not None else None
    comm = end.group(1) if end is not None else ""
    detail: dict[str, Any] = {"constraint": constraint}
    job_id, why = slurm_job_of_oom(message, uid)
    if job_id is None:
        detail["no_job"] = why
    return _oom(
        message,
        ProcessEvent.OOM_SUMMARY,
        pid=pid,
        comm=comm,
        job_id=job_id,
        uid=uid,
        detail=detail,
    )


def slurm_job_of_oom(message: str, uid: int | None) -> tuple[str | None, str]:
    """The Slurm job whose cgroup the OOM killer's summary names, or None and why not.

    The victim's memory cgroup (``task_memcg=``) must start with a job cgroup slurmstepd
    creates; ``oom_memcg=``, when it is a job's too, must name the same job; in cgroup v1 the
    path's ``uid_<n>`` must be the victim's uid. Each field must appear once: cgroup names may
    hold commas and these very words, and a line where they repeat cannot be read.
    """
    if uid is None:
        return None, "the line does not end with the task, pid and uid"
    paths = {}
    for name in ("task_memcg", "oom_memcg"):
        marker = f",{name}="
        first = message.find(marker)
        if first != -1 and message.find(marker, first + 1) != -1:
            return None, f"{name} appears more than once"
        paths[name] = None if first == -1 else message[first + len(marker) :]
    task_path = paths["task_memcg"]
    if task_path is None:
        return None, "no task_memcg"
    job, owner = _slurm_job(task_path)
    if job is None:
        return None, "the task's memory cgroup is not a Slurm job's"
    if owner is not None and owner != uid:
        return None, "the cgroup's uid is not the task's"
    oom_path = paths["oom_memcg"]
    if oom_path is not None:
        other, _ = _slurm_job(oom_path)
        if other is not None and other != job:
            return None, "oom_memcg and task_memcg name different jobs"
    return job, ""


def _slurm_job(path: str) -> tuple[str | None, int | None]:
    """The job id at the start of a cgroup path slurmstepd made, and the uid it names (v1)."""
    found = _SLURM_V1_JOB.match(path)
    if found is not None:
        return found.group(2), int(found.group(1))
    found = _SLURM_V2_JOB.match(path)
    return (found.group(1), None) if found is not None else (None, None)


def _device_fact(message: str) -> Fact | Shape | None:
    if message.startswith("NVRM: "):
        return _nvrm(message)
    if message.startswith("EDAC MC"):
        return _edac(message)
    if message.startswith("mce: "):
        return _mce(message)
    if message.startswith("Memory failure: ") and (found := _MEMORY_FAILURE.match(message)):
        return _host_memory(message, "memory-failure", f"pfn 0x{found.group(1)}", Severity.ERROR)
    if message.startswith("nvidia-nvswitch") and (found := _SXID.match(message)) is not None:
        fatal = found.group(4) == "Fatal"
        return DeviceFact(
            signature="nvswitch-sxid",
            category=FailureCategory.INTERCONNECT,
            attribution=Attribution.HARDWARE,
            severity=Severity.ERROR if fatal else Severity.WARNING,
            device=found.group(2),
            message=message,
            detail={"sxid": int(found.group(3)), "nvswitch": int(found.group(1))},
            discriminator="fatal" if fatal else "non-fatal",
        )
    if message.startswith("nvidia-nvlink: "):
        return Shape.DEVICE  # the NVLink core's own lines; its failures reach the log as Xid 74
    if (found := _PCI_DEVICE.match(message)) is not None:
        driver, device, interface = found.group(1), found.group(2), found.group(3)
        return _pci(message[found.end() :], message, driver, device, interface)
    return None


def _nvrm(message: str) -> Fact | Shape | None:
    if (found := _XID.match(message)) is not None:
        return _xid(message, found)
    if (found := _NVRM_GPU.match(message)) is not None:
        rest = message[found.end() :]
        if _GPU_OFF_BUS.match(rest) is not None:
            return _gpu(message, "gpu-fallen-off-bus", found.group(1), Severity.FATAL)
        if _RM_INIT_FAILED.match(rest) is not None:
            return _gpu(message, "gpu-lost", found.group(1), Severity.ERROR)
        return Shape.DEVICE
    if _NVRM_INIT_FAILED.match(message) is not None:
        return _gpu(message, "gpu-lost", "", Severity.ERROR)
    if _NVRM_CONTEXT.match(message) is not None:
        return Shape.DEVICE
    return None


def _xid(message: str, found: re2._Match[str]) -> DeviceFact | ProcessFact:
    code = int(found.group(4))
    meaning = xid_meaning(code)
    pid_text = found.group(5)
    detail: dict[str, Any] = {
        "xid": code,
        "xid_meaning": meaning.description,
        "known_xid": code in XID_MEANINGS,
        "pci": found.group(1),
    }
    if found.group(2) is not None:
        detail["gpu_instance"] = int(found.group(2))
    if found.group(3) is not None:
        detail["compute_instance"] = int(found.group(3))
    if meaning.attribution == Attribution.APPLICATION:
        # The application's fault: a fact about the process that made the channel.
        return ProcessFact(
            signature="nvidia-xid",
            event=ProcessEvent.APPLICATION_XID,
            category=meaning.category,
            attribution=meaning.attribution,
            severity=meaning.severity,
            message=message,
            pid=int(pid_text) if pid_text is not None and pid_text.isdigit() else None,
            detail=detail,
            discriminator=str(code),
        )
    return DeviceFact(
        signature="nvidia-xid",
        category=meaning.category,
        attribution=meaning.attribution,
        severity=meaning.severity,
        device=found.group(1),
        message=message,
        detail=detail,
        discriminator=str(code),
    )


def _gpu(message: str, signature: str, device: str, severity: Severity) -> DeviceFact:
    return DeviceFact(
        signature=signature,
        category=FailureCategory.GPU_HARDWARE,
        attribution=Attribution.HARDWARE,
        severity=severity,
        device=device,
        message=message,
        detail={"pci": device} if device else {},
    )


def _pci(
    text: str, message: str, driver: str, device: str, interface: str | None
) -> DeviceFact | Shape:
    network = driver in ("mlx5_core", "mlx4_core")
    category = FailureCategory.INTERCONNECT if network else FailureCategory.GPU_HARDWARE
    detail: dict[str, Any] = {"pci": device, "driver": driver}
    if (found := _AER.match(text)) is not None:
        severity_text = found.group(1) or found.group(2)
        corrected = severity_text.startswith("Correct")
        return DeviceFact(
            signature="pcie-aer-corrected" if corrected else "pcie-aer-uncorrected",
            category=category,
            attribution=Attribution.HARDWARE,
            severity=Severity.WARNING if corrected else Severity.ERROR,
            device=device,
            message=message,
            detail={**detail, "aer_severity": severity_text},
        )
    if _DPC.match(text) is not None:
        return DeviceFact(
            signature="pcie-dpc-containment",
            category=category,
            attribution=Attribution.HARDWARE,
            severity=Severity.ERROR,
            device=device,
            message=message,
            detail=detail,
        )
    if driver == "mlx5_core":
        return _mlx5(text, message, device, interface, detail)
    return Shape.DEVICE


def _mlx5(
    text: str, message: str, device: str, interface: str | None, detail: dict[str, Any]
) -> DeviceFact | Shape:
    if interface is not None:
        if _LINK_DOWN.match(text) is None:
            return Shape.DEVICE
        # A link going down is a hint (a cable pulled for maintenance, a switch restarting),
        # not a failure of the node on its own.
        return DeviceFact(
            signature="mlx5-link-down",
            category=FailureCategory.INTERCONNECT,
            attribution=Attribution.HARDWARE,
            severity=Severity.WARNING,
            device=device,
            message=message,
            detail={**detail, "interface": interface},
        )
    caller = _MLX5_CALLER.match(text)
    if caller is not None:
        text = text[caller.end() :]
    if (found := _MLX5_FATAL.match(text)) is not None:
        return DeviceFact(
            signature="mlx5-fatal-error",
            category=FailureCategory.INTERCONNECT,
            attribution=Attribution.HARDWARE,
            severity=Severity.FATAL,
            device=device,
            message=message,
            detail={**detail, "fatal_error": int(found.group(1))},
        )
    if _MLX5_HEALTH.match(text) is not None:
        return DeviceFact(
            signature="mlx5-health-compromised",
            category=FailureCategory.INTERCONNECT,
            attribution=Attribution.HARDWARE,
            severity=Severity.ERROR,
            device=device,
            message=message,
            detail=detail,
        )
    return Shape.DEVICE


def _edac(message: str) -> DeviceFact | None:
    found = _EDAC.match(message)
    if found is None:
        return None
    uncorrected = found.group(3) == "UE"
    fact = _host_memory(
        message,
        "edac-uncorrected" if uncorrected else "edac-corrected",
        f"MC{found.group(1)}",
        Severity.ERROR if uncorrected else Severity.WARNING,
    )
    fact.detail["errors"] = int(found.group(2))
    return fact


def _mce(message: str) -> DeviceFact | Shape | None:
    if (found := _MCE_BANK.match(message)) is not None:
        status = int(found.group(3), 16)
        uncorrected = bool(status & _MCI_STATUS_UC)
        severity = (
            (Severity.FATAL if status & _MCI_STATUS_PCC else Severity.ERROR)
            if uncorrected
            else Severity.WARNING
        )
        fact = _host_memory(
            message,
            "mce-uncorrected" if uncorrected else "mce-corrected",
            f"CPU {found.group(1)}",
            severity,
        )
        fact.detail.update(bank=int(found.group(2)), mci_status=found.group(3))
        return fact
    if _MCE_LOGGED.match(message) is not None:
        return _host_memory(message, "mce-corrected", "", Severity.WARNING)
    if (found := _MCE_USER_ACCESS.match(message)) is not None:
        return _host_memory(message, "mce-uncorrected", f"0x{found.group(1)}", Severity.ERROR)
    return Shape.DEVICE if _MCE_ANY.match(message) is not None else None


def _host_memory(message: str, signature: str, device: str, severity: Severity) -> DeviceFact:
    # The taxonomy has no category for the host's memory and CPUs: the attribution says it.
    return DeviceFact(
        signature=signature,
        category=NO_CATEGORY,
        attribution=Attribution.HARDWARE,
        severity=severity,
        device=device,
        message=message,
        detail={"component": "host"},
    )


# ----------------------------------------------------------------------------- reading a log


@dataclass
class _Record:
    """The record a line carrying user text began: later lines may be its continuation."""

    key: str | None
    room: int


def parse_kernel_log(data: bytes | str) -> KernelRead:
    """Every fact in a read of a kernel log (complete lines), and what was left out."""
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    read = KernelRead()
    open_record: _Record | None = None
    for number, line in enumerate(_lines(text), start=1):
        read.lines = number
        prefix = peel(line)
        if not prefix.message:
            continue
        if prefix.foreign:
            read.foreign += 1
            _hide(read.not_from_kernel, number, prefix)
            continue
        if prefix.indented or (
            open_record is not None and open_record.room > 0 and prefix.key == open_record.key
        ):
            read.continuations += 1
            if open_record is not None:
                open_record.room -= len(prefix.message) + 1
            _hide(read.in_continuations, number, prefix)
            continue
        found = classify(prefix.message)
        # A process line carries user text. So may a message of no known structure, of any
        # length (a path, a version string a program passed): only a record's own timestamp
        # tells its next lines from the next record's.
        open_record = None
        if (
            isinstance(found, ProcessFact)
            or found is Shape.PROCESS
            or (found is None and prefix.record is not None)
        ):
            open_record = _Record(prefix.key, MAX_RECORD_CHARS - len(prefix.message))
        if isinstance(found, (DeviceFact, ProcessFact)):
            read.entries.append(KernelEntry(number, found, prefix.at))
    return read


def _lines(text: str) -> Iterator[str]:
    start = 0
    while start < len(text):
        end = text.find("\n", start)
        if end == -1:
            end = len(text)
        yield text[start:end]
        start = end + 1


def _hide(hidden: list[KernelEntry], number: int, prefix: Prefix) -> None:
    found = classify(prefix.message)
    if isinstance(found, (DeviceFact, ProcessFact)):
        hidden.append(KernelEntry(number, found, prefix.at))


# ----------------------------------------------------------------------------- findings


def findings(entries: Iterable[KernelEntry], node: str) -> list[Finding]:
    """The entries as findings, one per signature and discriminator, counted.

    Device facts implicate ``node``, the host whose log it is. Process facts implicate no
    node: ``node`` is where they were printed (``detail["reported_by_nodes"]``).
    """
    grouped: dict[tuple[str, str, str], list[KernelEntry]] = {}
    for entry in entries:
        fact = entry.fact
        grouped.setdefault((fact.signature, fact.discriminator, fact.category), []).append(entry)
    made = [_finding(group, node) for group in grouped.values()]
    made.sort(key=lambda f: (-int(f.detail["priority"]), f.first_line or 0))
    return made


def _finding(group: list[KernelEntry], node: str) -> Finding:
    first, last = group[0], group[-1]
    fact = first.fact
    device = isinstance(fact, DeviceFact)
    priority = CATEGORY_PRIORITY.get(fact.category, HOST_HARDWARE_PRIORITY)
    detail: dict[str, Any] = {
        **fact.detail,
        "role": CAUSE,
        "reports_exit": False,
        "priority": priority,
        "last_line": last.line,
        "excerpt": "\n".join(e.fact.message for e in group[:3])[:MAX_MESSAGE_CHARS],
        "printed_by": PRINTED_BY.get(fact.signature, ""),
    }
    if isinstance(fact, DeviceFact):
        devices = sorted({e.fact.device for e in group if isinstance(e.fact, DeviceFact)} - {""})
        if devices:
            detail["devices"] = devices[:16]
    else:
        detail.update(event=str(fact.event), reported_by_nodes=[node])
        if fact.pid is not None:
            detail["pid"] = fact.pid
        if fact.uid is not None:
            detail["uid"] = fact.uid
        if fact.job_id is not None:
            detail["job_id"] = fact.job_id
    return Finding(
        kind=CRASH,
        category=fact.category,
        attribution=fact.attribution,
        severity=fact.severity,
        signature=fact.signature,
        evidence=fact.message[:MAX_EVIDENCE_CHARS],
        source=FindingSource.LOG,
        count=len(group),
        first_line=first.line,
        nodes=[node] if device else [],
        at=first.at,
        detail=detail,
        implicates_nodes=device,
    )


__all__ = [
    "OOM_EVENTS",
    "PRINTED_BY",
    "DeviceFact",
    "KernelEntry",
    "KernelRead",
    "Prefix",
    "ProcessEvent",
    "ProcessFact",
    "Shape",
    "classify",
    "findings",
    "parse_kernel_log",
    "peel",
    "slurm_job_of_oom",
]
