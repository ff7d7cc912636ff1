"""A kernel log's facts as findings, one per signature and discriminator, and who prints
each structure.

Kept apart from reading: the caller chooses which entries of a read become findings (the loop
reports a node's hardware facts apart from a job's process facts), in the shape the rest of
detection shares.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from recovery.detection.findings import CRASH, Finding, FindingSource
from recovery.detection.kernel_log.facts import DeviceFact, KernelEntry
from recovery.detection.normalize import MAX_MESSAGE_CHARS
from recovery.detection.signatures.base import CATEGORY_PRIORITY, CAUSE

MAX_EVIDENCE_CHARS = 1000
# Uncorrectable host memory and CPU errors: below a GPU off the bus, above the fabric.
HOST_HARDWARE_PRIORITY = 95

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
