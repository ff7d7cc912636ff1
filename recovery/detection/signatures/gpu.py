"""Signatures of failing GPU hardware: NVIDIA driver Xid reports, a GPU off the bus or lost,
uncorrectable ECC errors, PCIe AER reports, thermal and power slowdowns.

The Xid code on a ``nvidia-xid`` line decides its category and attribution (``refine``, from
``XID_MEANINGS`` in ``recovery.detection.facts``); the signature only finds the line.
"""

from __future__ import annotations

from recovery.detection.signatures.base import Signature, define
from recovery.detection.taxonomy import Attribution, FailureCategory, Severity

SIGNATURES: tuple[Signature, ...] = (
    define(
        "nvidia-xid",
        FailureCategory.GPU_HARDWARE,
        Attribution.HARDWARE,
        r"NVRM: Xid \(|\b(?:XID|Xid) (?:error )?(?:code )?\d+ (?:detected|error|reported)|"
        r"Xid error \d+|XID errors?: \d+ ",
        [
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=2231, GPU has fallen off the bus.",
            "kernel: [12345.678] NVRM: Xid (PCI:0000:b7:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
            "NVRM: Xid (PCI:0000:4e:00): 13, pid=1201, name=python, Graphics SM Warp Exception on (GPC 1, TPC 0, SM 1): Out Of Range Address",
        ],
        [
            "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.104.05",
            "Xid: 0 errors",
            'DCGM_FI_DEV_XID_ERRORS{gpu="0"} 0',
        ],
        description="NVIDIA driver error report; the Xid code decides category and attribution.",
    ),
    define(
        "gpu-fallen-off-bus",
        FailureCategory.GPU_HARDWARE,
        Attribution.HARDWARE,
        r"(?:GPU has fallen off the bus|fallen off the bus)",
        ["NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."],
        ["PCI bus 0000:3b scan complete"],
    ),
    define(
        "gpu-lost",
        FailureCategory.GPU_HARDWARE,
        Attribution.HARDWARE,
        r"(?:GPU is lost|Unable to determine the device handle for GPU|"
        r"No devices were found|GPU requires reset|RmInitAdapter failed|"
        r"cudaErrorDevicesUnavailable|CUDA_ERROR_ECC_UNCORRECTABLE)",
        [
            "Unable to determine the device handle for GPU 0000:17:00.0: GPU is lost.  Reboot the system to recover this GPU",
            "Unable to determine the device handle for GPU0000:03:00.0: Unknown Error",
            "NVRM: RmInitAdapter failed! (0x26:0x65:1474)",
            "GPU 00000000:3B:00.0: GPU requires reset",
        ],
        ["Found 8 GPUs", "Determining the device handle for GPU 0"],
    ),
    define(
        "cuda-ecc-uncorrectable",
        FailureCategory.GPU_HARDWARE,
        Attribution.HARDWARE,
        r"(?:uncorrectable ECC error|ECC error encountered|"
        r"double bit (?:ECC )?error|Uncorrectable (?:ECC|DBE)|"
        r"row remapp?ing (?:failure|pending|failed)|Remapped Rows Pending)",
        [
            "RuntimeError: CUDA error: uncorrectable ECC error encountered",
            "torch.AcceleratorError: CUDA error: uncorrectable ECC error encountered",
            "GPU 3: Remapped Rows Pending: Yes",
        ],
        ["Volatile Uncorr. ECC: 0", "ECC mode enabled"],
        caseless=True,
    ),
    define(
        "cuda-hardware-error",
        FailureCategory.GPU_HARDWARE,
        Attribution.HARDWARE,
        r"(?:CUDA error: unspecified launch failure on device|"
        r"cudaErrorHardwareStackError|CUDA error: hardware stack error|"
        r"CUDA_ERROR_HARDWARE_STACK_ERROR|CUDA error: an uncorrectable NVLink error|"
        r"GPU \d+ is not healthy|DCGM.*(?:XID|ECC|row remap).*(?:error|failure))",
        [
            "RuntimeError: CUDA error: hardware stack error",
            "DCGM health check: GPU 3 XID error detected (XID 79)",
        ],
        ["CUDA error checking enabled"],
        printed_by='the CUDA runtime (cudaErrorHardwareStackError "hardware stack error", cudaErrorLaunchFailure) and DCGM\'s health checks',
    ),
    define(
        "pcie-aer-uncorrected",
        FailureCategory.GPU_HARDWARE,
        Attribution.HARDWARE,
        r"(?:PCIe Bus Error: severity=(?:Uncorrected|Fatal)|AER: Uncorrected \(Fatal\)|"
        r"AER: Uncorrected \(Non-Fatal\))",
        [
            "pcieport 0000:00:03.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Receiver ID)",
            "pcieport 0000:80:01.0: AER: Uncorrected (Non-Fatal) error received: 0000:81:00.0",
        ],
        [
            "pcieport 0000:00:03.0: PCIe Bus Error: severity=Corrected, type=Data Link Layer, (Transmitter ID)",
        ],
        printed_by="the Linux kernel's PCIe AER driver (drivers/pci/pcie/aer.c)",
    ),
    define(
        "pcie-aer-corrected",
        FailureCategory.GPU_HARDWARE,
        Attribution.HARDWARE,
        r"PCIe Bus Error: severity=Corrected",
        [
            "pcieport 0000:00:03.0: PCIe Bus Error: severity=Corrected, type=Data Link Layer, (Transmitter ID)",
        ],
        ["PCIe link up at 16 GT/s"],
        severity=Severity.WARNING,
        priority=20,
        description="Corrected PCIe errors are a hint, not a failure on their own.",
        printed_by="the Linux kernel's PCIe AER driver (drivers/pci/pcie/aer.c)",
    ),
    define(
        "gpu-thermal-power",
        FailureCategory.GPU_HARDWARE,
        Attribution.HARDWARE,
        r"(?:HW Slowdown: Active|HW Thermal Slowdown: Active|thermal violation|"
        r"GPU is (?:over|above) (?:its )?(?:temperature|thermal)|Power brake.*Active)",
        ["GPU 5: HW Thermal Slowdown: Active", "Clocks Event Reasons: HW Slowdown: Active"],
        ["HW Slowdown: Not Active", "HW Thermal Slowdown: Not Active"],
        severity=Severity.WARNING,
        priority=40,
        caseless=True,
        printed_by="nvidia-smi -q, its Clocks Event Reasons (formerly Clocks Throttle Reasons) section",
    ),
    define(
        "nvidia-driver-unreachable",
        FailureCategory.GPU_HARDWARE,
        Attribution.HARDWARE,
        r"(?:NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver|"
        r"Retired Pages Pending\s*:\s*Yes|Pending Page Blacklist\s*:\s*Yes|"
        r"[Dd]etected (?:an? )?(?:uncorrectable|double-bit|DBE) ECC)",
        [
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.",
            "        Pending Page Blacklist          : Yes",
        ],
        [
            "        Pending Page Blacklist          : No",
            "NVIDIA-SMI 535.104.05   Driver Version: 535.104.05",
        ],
        printed_by='nvidia-smi ("couldn\'t communicate with the NVIDIA driver", -q "Pending Page Blacklist")',
    ),
    define(
        "nvrm-driver-error",
        FailureCategory.GPU_HARDWARE,
        Attribution.HARDWARE,
        # The resource manager's own errors that come without an Xid line: the GSP firmware
        # not answering (heartbeat, RPC), memory-subsystem checks, a GPU the driver cannot
        # bring up. Informational NVRM lines (module loading, versions) carry none of these.
        r"NVRM: .{0,160}?(?:GSP (?:Timeout|RPC timeout|error|crashed)|[Hh]eartbeat timed out|"
        r"_kgspLogRpcTimeout|RPC (?:timeout|timed out)|rpcSendMessage failed|"
        r"Memory Subsystem Error|timeout error waiting|RmInitAdapter failed|rm_init_adapter failed|"
        r"failed to (?:allocate|initialize|bootstrap)|cannot bootstrap GSP|GPU lost|"
        r"_threadNodeCheckTimeout|nvAssertOkFailed|osHandleGpuLost)",
        [
            "NVRM: GPU6 _kgspIsHeartbeatTimedOut: Heartbeat timed out, currentTimeMs 812751949 heartbeat 1899482",
            "NVRM: GPU6 kgmmuCheckMemSubsysError_IMPL: Memory Subsystem Error detected. kbusSendSysmembarSingle failed.",
            "NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x62:0x40:2163)",
        ],
        [
            "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  595.71.05  Release Build",
            "NVRM: GPU0 GSP firmware loaded",
            "NVRM: Persistence mode is enabled for GPU 0000:3b:00.0",
        ],
        description="The NVIDIA driver's resource manager reporting a GPU it cannot talk to or "
        "run (GSP firmware timeouts, memory-subsystem errors, failed initialisation) without "
        "an Xid code; the GPU needs a reset, as for Xids 119 and 120.",
        printed_by="the NVIDIA kernel driver's resource manager (NVRM) in the kernel log",
    ),
    define(
        "amdgpu-hardware-error",
        FailureCategory.GPU_HARDWARE,
        Attribution.HARDWARE,
        r"(?:amdgpu[^:]*: (?:amdgpu: )?GPU reset begin|amdgpu[^:]*: (?:amdgpu: )?MODE[12] reset|"
        r"amdgpu.*ring \S+ timeout|amdgpu.*uncorrectable|amdgpu.*(?:RAS|ras) .*(?:error|poison)|"
        r"\[Hardware Error\]: (?:Hardware error from APEI|event severity: (?:fatal|recoverable)))",
        [
            "[76914.214195] amdgpu 0000:dd:00.0: amdgpu: GPU reset begin!",
            "[76914.238315] amdgpu 0000:1b:00.0: amdgpu: MODE1 reset",
            "[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 1",
        ],
        [
            "[    5.1] amdgpu 0000:9d:00.0: amdgpu: SMU is initialized successfully!",
            "[76914.190522] amdgpu 0000:9d:00.0: {1}socket: 6, die: 1, 1533 new correctable hardware errors detected in xgmi_wafl block",
        ],
        description="AMD GPUs' driver resetting a GPU after a hardware fault or a hung ring, "
        "and the platform's own hardware error reports (APEI).",
        printed_by="the amdgpu kernel driver and the kernel's APEI/GHES error reporting",
    ),
)
