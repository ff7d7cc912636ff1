"""NVIDIA Xid codes: what each shows, which layer it usually blames, and how bad it is.

``XID_MEANINGS`` is the one table of NVIDIA Xid codes in the project: node reasons, DCGM metrics
and the log signatures' refinement (``recovery.detection.refine``) all read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from recovery.detection.taxonomy import Attribution, FailureCategory, Severity


@dataclass(frozen=True)
class XidMeaning:
    """What an Xid code shows (category), which layer it usually blames, and how bad it is."""

    category: FailureCategory
    attribution: Attribution
    description: str
    severity: Severity = Severity.ERROR


# From NVIDIA's Xid documentation (the "Xid errors" catalogue and the GPU memory error
# management guide). Only codes seen on training clusters and whose meaning is settled are
# listed; an unknown code is reported as gpu_hardware with attribution "unknown".
XID_MEANINGS: dict[int, XidMeaning] = {
    13: XidMeaning(
        FailureCategory.CUDA_ERROR_APP,
        Attribution.APPLICATION,
        "graphics engine exception: usually the application's fault (e.g. out-of-range access)",
    ),
    31: XidMeaning(
        FailureCategory.CUDA_ERROR_APP,
        Attribution.APPLICATION,
        "GPU memory page fault (MMU fault): usually an illegal memory access by the application",
    ),
    32: XidMeaning(
        FailureCategory.GPU_HARDWARE,
        Attribution.UNKNOWN,
        "invalid or corrupted push buffer stream: driver, system memory or PCIe bus corruption",
    ),
    38: XidMeaning(
        FailureCategory.GPU_HARDWARE, Attribution.SYSTEM_SOFTWARE, "driver firmware error"
    ),
    43: XidMeaning(
        FailureCategory.CUDA_ERROR_APP,
        Attribution.APPLICATION,
        "GPU stopped processing (reset channel verification error): the application's context "
        "faulted",
    ),
    45: XidMeaning(
        FailureCategory.CUDA_ERROR_APP,
        Attribution.UNKNOWN,
        "preemptive cleanup of a GPU context after earlier errors or a killed process: a "
        "symptom, the cause is the error before it",
        severity=Severity.WARNING,
    ),
    48: XidMeaning(
        FailureCategory.GPU_HARDWARE,
        Attribution.HARDWARE,
        "double-bit ECC error (DBE): uncorrectable GPU memory error",
        severity=Severity.FATAL,
    ),
    61: XidMeaning(
        FailureCategory.GPU_HARDWARE,
        Attribution.HARDWARE,
        "internal micro-controller breakpoint/warning (PMU)",
    ),
    62: XidMeaning(
        FailureCategory.GPU_HARDWARE,
        Attribution.HARDWARE,
        "internal micro-controller halt (PMU)",
        severity=Severity.FATAL,
    ),
    63: XidMeaning(
        FailureCategory.GPU_HARDWARE,
        Attribution.HARDWARE,
        "ECC page retirement or row-remapping recording event: reset the GPU for it to take effect",
        severity=Severity.WARNING,
    ),
    64: XidMeaning(
        FailureCategory.GPU_HARDWARE,
        Attribution.HARDWARE,
        "ECC page retirement or row-remapping recording failure",
    ),
    74: XidMeaning(FailureCategory.INTERCONNECT, Attribution.HARDWARE, "NVLink error"),
    79: XidMeaning(
        FailureCategory.GPU_HARDWARE,
        Attribution.HARDWARE,
        "GPU has fallen off the bus: it no longer answers on PCIe",
        severity=Severity.FATAL,
    ),
    92: XidMeaning(
        FailureCategory.GPU_HARDWARE,
        Attribution.HARDWARE,
        "high single-bit ECC error rate",
        severity=Severity.WARNING,
    ),
    94: XidMeaning(
        FailureCategory.GPU_HARDWARE,
        Attribution.HARDWARE,
        "contained ECC error: the affected application was stopped, the GPU needs a reset",
    ),
    95: XidMeaning(
        FailureCategory.GPU_HARDWARE,
        Attribution.HARDWARE,
        "uncontained ECC error: every application on the GPU is affected, the GPU must be reset",
        severity=Severity.FATAL,
    ),
    # GSP firmware faults need a GPU reset whatever their root cause, so the node is kept out
    # of the next attempt; the same code on many nodes at once points at the driver/firmware.
    119: XidMeaning(
        FailureCategory.GPU_HARDWARE,
        Attribution.HARDWARE,
        "GSP RPC timeout: the GPU System Processor stopped answering, the GPU needs a reset",
        severity=Severity.FATAL,
    ),
    120: XidMeaning(
        FailureCategory.GPU_HARDWARE,
        Attribution.HARDWARE,
        "GSP error: the GPU System Processor firmware failed, the GPU needs a reset",
        severity=Severity.FATAL,
    ),
    # NVLink5 errors the GPU reports about its own links (Blackwell: NVLINK SAW, RLW, TLW,
    # TREX, NVLPW control, NETIR, MSE). The links stay down until the GPU is reset, so they
    # are the GPU's hardware, not the fabric between nodes.
    **{
        code: XidMeaning(
            FailureCategory.GPU_HARDWARE,
            Attribution.HARDWARE,
            f"NVLink error reported by the GPU ({unit}): its links need a GPU reset",
            severity=Severity.FATAL,
        )
        for code, unit in (
            (144, "NVLINK SAW"),
            (145, "NVLINK RLW"),
            (146, "NVLINK TLW"),
            (147, "NVLINK TREX"),
            (148, "NVLINK NVLPW control"),
            (149, "NVLINK NETIR"),
            (150, "NVLINK MSE"),
        )
    },
    154: XidMeaning(
        FailureCategory.GPU_HARDWARE,
        Attribution.HARDWARE,
        "GPU recovery action changed: the driver asks for a GPU reset or a node reboot",
    ),
}

UNKNOWN_XID = XidMeaning(FailureCategory.GPU_HARDWARE, Attribution.UNKNOWN, "Xid not in the table")


def xid_meaning(code: int) -> XidMeaning:
    """The table entry for ``code``, or a neutral GPU-hardware meaning for unlisted codes."""
    return XID_MEANINGS.get(code, UNKNOWN_XID)
