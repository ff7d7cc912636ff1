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

The reader is split by what its parts do: ``facts`` (what comes out), ``prefixes`` (the
dmesg, syslog and journal prefixes before a message), ``process_lines`` and ``device_lines``
(each kind of message by its structure), ``reading`` (a whole log, record by record) and
``reporting`` (facts as findings). The names below are the reader's public interface.
"""

from __future__ import annotations

from recovery.detection.kernel_log.facts import (
    OOM_EVENTS,
    DeviceFact,
    KernelEntry,
    KernelRead,
    ProcessEvent,
    ProcessFact,
    Shape,
)
from recovery.detection.kernel_log.prefixes import Prefix, peel
from recovery.detection.kernel_log.process_lines import slurm_job_of_oom
from recovery.detection.kernel_log.reading import classify, parse_kernel_log
from recovery.detection.kernel_log.reporting import PRINTED_BY, findings

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
