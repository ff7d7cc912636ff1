"""Device lines: what the NVIDIA, NVSwitch, PCIe, mlx5, EDAC, MCE and memory-failure code
prints about a device, each by the structure its driver prints.

Kept apart from the process lines: only these facts may implicate a node, and each is
recognised from the message's first character by its driver's own prefix.
"""

from __future__ import annotations

from typing import Any

import re2

from recovery.detection.facts.xid import XID_MEANINGS, xid_meaning
from recovery.detection.kernel_log.facts import (
    DeviceFact,
    Fact,
    ProcessEvent,
    ProcessFact,
    Shape,
)
from recovery.detection.linear_regex import compile_linear
from recovery.detection.taxonomy import NO_CATEGORY, Attribution, FailureCategory, Severity

_HEX = "[0-9a-fA-F]"
# The NVIDIA driver's "PCI:%04x:%02x:%02x" (domain, bus, device) and the PCI core's device
# name "%04x:%02x:%02x.%d" (with the function).
_XID_BDF = f"{_HEX}{{4}}:{_HEX}{{2}}:{_HEX}{{2}}"
_PCI_NAME = f"{_XID_BDF}\\.[0-7]"

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
