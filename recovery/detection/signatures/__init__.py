"""The built-in failure signatures.

Each signature names one thing real software prints when a training job fails: the NVIDIA
driver (``NVRM: Xid``), CUDA and PyTorch, NCCL, InfiniBand verbs and Mellanox drivers, Slurm's
``slurmstepd``/``srun``, the Linux OOM killer, the kernel and Python. A signature carries its
category and default attribution from the design's taxonomy, a severity, and a ``role``:

- ``cause``: evidence of what went wrong (an Xid, an OOM, an exception);
- ``symptom``: what other ranks print because of a cause elsewhere (collective timeouts);
- ``wrapper``: a launcher reporting that a child died (``ChildFailedError``, ``srun: error:
  task N: Exited``); it never hides the exception it wraps, but may be all there is.

``reports_exit`` marks lines a launcher or Slurm prints once a process has ended (srun's
task-exit lines, torchrun's child failure, slurmstepd's cancel notices). Any other failure line
may be printed by a program that goes on (a caught exception logged with its traceback): it is
a suspected crash until the process is seen to end.

``priority`` orders causes when several appear in one log: hardware evidence outranks the
symptoms it causes. Patterns use the syntax common to RE2 and Hyperscan (no lookaround, no
backreferences), so every pattern runs in linear time on either engine. They are unanchored:
they match a message with or without its rank, host and timestamp prefixes.

Every signature's ``examples`` must match and ``counter_examples`` must not; the tests run them.

The signatures are declared by family, one module each: ``gpu``, ``interconnect``,
``collectives``, ``cuda``, ``host``, ``jobs``, ``application``. ``MATCH_ORDER`` below is the
order they are tried in; when several match one line with the same priority, the earlier one
wins, so moving a name changes verdicts.
"""

from __future__ import annotations

from recovery.detection.signatures import (
    application,
    collectives,
    cuda,
    gpu,
    host,
    interconnect,
    jobs,
)
from recovery.detection.signatures.base import (
    CATEGORY_PRIORITY,
    CAUSE,
    GENERIC_EXCEPTION,
    NONFINITE_PROGRESS_VALUE,
    SYMPTOM,
    WRAPPER,
    Signature,
    SignatureRole,
    define,
)

__all__ = (
    "CATEGORY_PRIORITY",
    "CAUSE",
    "GENERIC_EXCEPTION",
    "MATCH_ORDER",
    "NONFINITE_PROGRESS_VALUE",
    "SIGNATURES",
    "SYMPTOM",
    "WRAPPER",
    "Signature",
    "SignatureRole",
    "define",
)

_FAMILIES = (gpu, interconnect, collectives, cuda, host, jobs, application)

# The order in which signatures were added, kept because ties in priority go to the earlier.
MATCH_ORDER: tuple[str, ...] = (
    "nvidia-xid",
    "gpu-fallen-off-bus",
    "gpu-lost",
    "cuda-ecc-uncorrectable",
    "cuda-hardware-error",
    "pcie-aer-uncorrected",
    "pcie-aer-corrected",
    "gpu-thermal-power",
    "ib-completion-error",
    "ib-async-fatal",
    "ib-async-event-failed",
    "net-plugin-setup-failed",
    "nvlink-error",
    "nccl-remote-error",
    "nccl-socket-peer-lost",
    "nccl-comm-aborted",
    "torch-signal-exception",
    "nccl-error-raised",
    "nccl-warn-fatal",
    "nccl-shm-failure",
    "nccl-watchdog-timeout",
    "cuda-device-assert",
    "cuda-error-kernel",
    "cuda-driver-mismatch",
    "cuda-out-of-memory",
    "kernel-oom-killer",
    "native-allocation-failed",
    "dataloader-worker-killed",
    "sigkill-child",
    "storage-errno",
    "slurm-time-limit",
    "slurm-preempted",
    "slurm-node-failure",
    "slurm-cancelled",
    "segmentation-fault",
    "process-aborted",
    "loss-nan",
    "nonfinite-progress-value",
    "loss-scale-collapse",
    "python-exception",
    "torch-state-dict-mismatch",
    "python-traceback",
    "nvidia-driver-unreachable",
    "cuda-device-unavailable",
    "ib-completion-status",
    "nccl-error-legacy",
    "peer-connection-lost",
    "distributed-setup-timeout",
    "srun-out-of-memory",
    "storage-remote",
    "slurm-daemon-job-failure",
    "slurm-killed-stuck",
    "submitit-timeout",
    "signal-exit-codes",
    "loss-divergence-extra",
    "python-exception-ignored",
    "dist-network-error",
    "too-many-open-files",
    "torchelastic-child-failed",
    "srun-task-exited",
    "cuda-error-code",
    "framework-device-oom",
    "nccl-result",
    "nccl-library-unavailable",
    "gloo-mesh-failed",
    "libfabric-provider-error",
    "ibv-call-failed",
    "cpp-uncaught-exception",
    "hydra-job-failed",
    "ray-memory-monitor",
    "batch-walltime-exceeded",
    "batch-memory-limit",
    "pod-evicted",
    "cloud-instance-reclaimed",
    "nvrm-driver-error",
    "slurm-job-state",
    "runtime-panic",
    "framework-memory-limit",
    "nccl-result-trace",
    "rendezvous-connection-failed",
    "amdgpu-hardware-error",
    "ray-disk-full",
)


def _in_match_order() -> list[Signature]:
    declared = [signature for family in _FAMILIES for signature in family.SIGNATURES]
    by_name = {signature.name: signature for signature in declared}
    if len(by_name) != len(declared):
        raise ValueError("two built-in signatures share a name")
    if sorted(by_name) != sorted(MATCH_ORDER):
        missing = sorted(set(by_name) ^ set(MATCH_ORDER))
        raise ValueError(f"MATCH_ORDER and the declared signatures differ: {missing}")
    return [by_name[name] for name in MATCH_ORDER]


SIGNATURES: list[Signature] = _in_match_order()
