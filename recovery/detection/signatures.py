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
"""

from __future__ import annotations

from dataclasses import dataclass, field

GENERIC_EXCEPTION = "python-exception"
CAUSE = "cause"
SYMPTOM = "symptom"
WRAPPER = "wrapper"


@dataclass(frozen=True)
class Signature:
    name: str
    category: str
    attribution: str
    severity: str
    pattern: str
    examples: tuple[str, ...]
    counter_examples: tuple[str, ...] = ()
    role: str = CAUSE
    priority: int = 50
    caseless: bool = False
    description: str = ""
    builtin: bool = True
    tags: frozenset[str] = field(default_factory=frozenset)
    reports_exit: bool = False


def _sig(
    name: str,
    category: str,
    attribution: str,
    pattern: str,
    examples: tuple[str, ...] | list[str],
    counter_examples: tuple[str, ...] | list[str] = (),
    *,
    severity: str = "fatal",
    role: str = CAUSE,
    priority: int | None = None,
    caseless: bool = False,
    description: str = "",
    reports_exit: bool = False,
) -> Signature:
    return Signature(
        name=name,
        category=category,
        attribution=attribution,
        severity=severity,
        pattern=pattern,
        examples=tuple(examples),
        counter_examples=tuple(counter_examples),
        role=role,
        priority=CATEGORY_PRIORITY[category] if priority is None else priority,
        caseless=caseless,
        description=description,
        reports_exit=reports_exit,
    )


# How likely each category is to be the root cause when several appear in one failed job.
# Hardware first: a GPU falling off the bus makes every other rank time out.
CATEGORY_PRIORITY: dict[str, int] = {
    "gpu_hardware": 100,
    "interconnect": 90,
    "scheduler_event": 86,
    "host_oom": 84,
    "storage_io": 82,
    "gpu_oom": 80,
    "cuda_error_app": 76,
    "nan_divergence": 72,
    "app_exception": 60,
    "nccl_error": 55,
    "segfault": 50,
    "nccl_timeout": 30,
}

SIGNATURES: list[Signature] = [
    # ------------------------------------------------------------------ gpu_hardware
    _sig(
        "nvidia-xid",
        "gpu_hardware",
        "hardware",
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
    _sig(
        "gpu-fallen-off-bus",
        "gpu_hardware",
        "hardware",
        r"(?:GPU has fallen off the bus|fallen off the bus)",
        ["NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."],
        ["PCI bus 0000:3b scan complete"],
    ),
    _sig(
        "gpu-lost",
        "gpu_hardware",
        "hardware",
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
    _sig(
        "cuda-ecc-uncorrectable",
        "gpu_hardware",
        "hardware",
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
    _sig(
        "cuda-hardware-error",
        "gpu_hardware",
        "hardware",
        r"(?:CUDA error: unspecified launch failure on device|"
        r"cudaErrorHardwareStackError|CUDA error: hardware stack error|"
        r"CUDA_ERROR_HARDWARE_STACK_ERROR|CUDA error: an uncorrectable NVLink error|"
        r"GPU \d+ is not healthy|DCGM.*(?:XID|ECC|row remap).*(?:error|failure))",
        [
            "RuntimeError: CUDA error: hardware stack error",
            "DCGM health check: GPU 3 XID error detected (XID 79)",
        ],
        ["CUDA error checking enabled"],
    ),
    _sig(
        "pcie-aer-uncorrected",
        "gpu_hardware",
        "hardware",
        r"(?:PCIe Bus Error: severity=(?:Uncorrected|Fatal)|AER: Uncorrected \(Fatal\)|"
        r"AER: Uncorrected \(Non-Fatal\))",
        [
            "pcieport 0000:00:03.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Receiver ID)",
            "pcieport 0000:80:01.0: AER: Uncorrected (Non-Fatal) error received: 0000:81:00.0",
        ],
        [
            "pcieport 0000:00:03.0: PCIe Bus Error: severity=Corrected, type=Data Link Layer, (Transmitter ID)",
        ],
    ),
    _sig(
        "pcie-aer-corrected",
        "gpu_hardware",
        "hardware",
        r"PCIe Bus Error: severity=Corrected",
        [
            "pcieport 0000:00:03.0: PCIe Bus Error: severity=Corrected, type=Data Link Layer, (Transmitter ID)",
        ],
        ["PCIe link up at 16 GT/s"],
        severity="warning",
        priority=20,
        description="Corrected PCIe errors are a hint, not a failure on their own.",
    ),
    _sig(
        "gpu-thermal-power",
        "gpu_hardware",
        "hardware",
        r"(?:HW Slowdown: Active|HW Thermal Slowdown: Active|thermal violation|"
        r"GPU is (?:over|above) (?:its )?(?:temperature|thermal)|Power brake.*Active)",
        ["GPU 5: HW Thermal Slowdown: Active", "Clocks Event Reasons: HW Slowdown: Active"],
        ["HW Slowdown: Not Active", "HW Thermal Slowdown: Not Active"],
        severity="warning",
        priority=40,
        caseless=True,
    ),
    # ------------------------------------------------------------------ interconnect
    _sig(
        "ib-completion-error",
        "interconnect",
        "unknown",
        r"(?:NET/IB ?: Got completion (?:from peer \S+ )?with error|"
        r"IBV_WC_RETRY_EXC_ERR|transport retry counter exceeded|"
        r"IBV_WC_REM_ACCESS_ERR|remote access error|local protection error|"
        r"NET/OFI [^\n]*completed with error|NCCL WARN NET/IB ?: [^\n]*(?:failed|error)|"
        r"ibv_poll_cq.*(?:error|failed)|Work Request Flushed Error)",
        [
            "node001:24141:24296 [2] ib_plugin.c:978 NCCL WARN NET/IB : Got completion from peer 10.226.98.98<48598> with error 12, opcode 0, len 0, vendor err 129",
            "NET/OFI Request 0x7f14cc5b60c0 completed with error. RC: 113. Error: 2 (UNDELIVERABLE). Completed length: 0",
            "mlx5: got completion with error: transport retry counter exceeded",
        ],
        ["NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.1.2.3<0>"],
    ),
    _sig(
        "ib-async-fatal",
        "interconnect",
        "hardware",
        r"(?:local catastrophic error|IBV_EVENT_DEVICE_FATAL|IBV_EVENT_PORT_ERR|"
        r"port error event|Got async event : (?:port error|device fatal|local catastrophic)|"
        r"health compromised|mlx5_core [^\n]*(?:Fatal error|firmware (?:error|stuck|fatal)|"
        r"(?:FW|firmware) fatal)|[Ll]ink (?:is )?[Dd]own|Physical state: Disabled|"
        r"symbol error counter|LinkDownedCounter|port_rcv_errors)",
        [
            "transport/net_ib.cu:80 NCCL WARN NET/IB : Got async event : local catastrophic error",
            "mlx5_core 0000:5e:00.0: mlx5_health_report:123:(pid 0): device's health compromised - reached miss count",
            "mlx5_core 0000:3b:00.0 ib0: Link down",
            "NCCL WARN NET/IB : Got async event : port error",
        ],
        [
            "mlx5_core 0000:3b:00.0 ib0: Link up",
            "mlx5_core 0000:5e:00.0: firmware version: 28.39.1002",
        ],
        priority=92,
    ),
    _sig(
        "ib-async-event-failed",
        "interconnect",
        "unknown",
        r"(?:Call to ibv_get_async_event failed|ibv_modify_qp failed|"
        r"ibv_create_qp failed|ibv_reg_mr(?:_iova2?)? failed|"
        r"Unable to register memory|RDMA_CM_EVENT_(?:UNREACHABLE|REJECTED|ADDR_ERROR))",
        [
            "misc/ibvwrap.cu:220 NCCL WARN Call to ibv_get_async_event failed",
            "misc/ibvwrap.cc:284 NCCL WARN Call to ibv_modify_qp failed with error Connection timed out",
        ],
        [
            "misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]",
            "NCCL INFO NET/IB : No device found.",
        ],
    ),
    _sig(
        "nvlink-error",
        "interconnect",
        "hardware",
        r"(?:NVLink (?:error|fatal)|NVLINK: fatal|nvlink .* (?:down|failed)|"
        r"NVSwitch.*(?:fatal|error)|nvswitch.*(?:fatal|SXid)|SXid|Fabric Manager.*(?:error|fail))",
        [
            "nvidia-nvswitch2: SXid (PCI:0000:c5:00.0): 12028, Non-fatal, Link 44 egress non-posted PRIV error",
            "NVRM: NVLink: fatal error detected on link 3",
            "Fabric Manager: training failed for GPU 3",
        ],
        ["NVLink bandwidth test passed", "NCCL INFO Channel 00/24 : 0[0] -> 1[1] via P2P/NVLink"],
        caseless=True,
        priority=92,
    ),
    _sig(
        "nccl-remote-error",
        "interconnect",
        "unknown",
        r"(?:ncclRemoteError|remote process exited or there was a network error)",
        [
            "torch.distributed.DistBackendError: NCCL error in: /opt/pytorch/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3763, remote process exited or there was a network error, NCCL version 2.28.8",
            "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
        ],
        ["NCCL INFO comm 0x55 rank 3 nranks 16 - Init COMPLETE"],
        priority=52,
        description="A peer died or the network failed: weaker than evidence naming either.",
    ),
    # ------------------------------------------------------------------ nccl_error
    _sig(
        "nccl-comm-aborted",
        "nccl_error",
        "unknown",
        r"(?:NCCL communicator was aborted|communicator encountered error|"
        r"ProcessGroupNCCL is aborted|Process group watchdog thread terminated with exception|"
        r"NCCL watchdog thread terminated|To avoid data inconsistency, we are taking the entire "
        r"process down|ProcessGroupNCCL's watchdog detected)",
        [
            "RuntimeError: NCCL communicator was aborted on rank 3. Original reason for failure was: [Rank 3] Watchdog caught collective operation timeout",
            "[Rank 1] To avoid data inconsistency, we are taking the entire process down.",
        ],
        ["NCCL INFO comm 0x7f abort COMPLETE"],
        role=SYMPTOM,
        priority=28,
        description="A rank shutting down after a collective failed elsewhere.",
    ),
    _sig(
        "torch-signal-exception",
        "scheduler_event",
        "unknown",
        r"(?:SignalException: Process \d+ got signal: (?:15|1|2|10|12)|"
        r"Received SIGTERM|got SIGTERM|Bypassing SIGTERM|KeyboardInterrupt)",
        [
            "torch.distributed.elastic.multiprocessing.api.SignalException: Process 4242 got signal: 15",
            "[rank: 0] Received SIGTERM: 15",
        ],
        ["SIGTERM handler installed"],
        role=WRAPPER,
        severity="error",
        priority=12,
        description="The job was told to stop: by the scheduler, an operator or a time limit.",
    ),
    _sig(
        "nccl-error-raised",
        "nccl_error",
        "unknown",
        r"(?:NCCL error in: \S+|NCCL error: (?:unhandled|internal|invalid|remote)|"
        r"ncclInternalError|ncclInvalidUsage|ncclInvalidArgument|ncclUnhandledCudaError|"
        r"ncclSystemError|Failed to initialize NCCL|ProcessGroupNCCL.*ncclCommInitRank failed)",
        [
            "RuntimeError: NCCL error in: ../torch/lib/c10d/ProcessGroupNCCL.cpp:825, internal error, NCCL version 20.9.9",
            "ncclInternalError: Internal check failed. This is either a bug in NCCL or due to memory corruption",
            "what():  NCCL error: unhandled system error, NCCL version 2.14.3",
        ],
        ["NCCL version 2.18.1+cuda12.1", "NCCL INFO Using network IB"],
    ),
    _sig(
        "nccl-warn-fatal",
        "nccl_error",
        "unknown",
        r"NCCL WARN (?:.*(?:failed|\b[Ee]rror\b|timeout|timed out|Broken pipe|"
        r"Connection (?:closed|reset|refused)|Aborting|Cuda failure|unhandled|"
        r"Failed to (?:execute|connect|send|recv|receive|register|allocate|create|init)))",
        [
            "a100-st-p4d24xlarge-22:183006:183220 [1] misc/socket.cc:518 NCCL WARN Net : Call to recv from 10.200.84.247<58355> failed : Broken pipe",
            "proxy.cc:1119 NCCL WARN [Proxy Service 9] Failed to execute operation Connect from rank 9, retcode 6",
            "enqueue.cc:1008 NCCL WARN Cuda failure 'an illegal memory access was encountered'",
        ],
        [
            "misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]",
            "NCCL WARN NET/Plugin : Plugin load (libnccl-net.so) returned 2 : libnccl-net.so: cannot open shared object file: No such file or directory",
            "NCCL WARN Could not find real path of /sys/class/net/eth0/device",
            "NCCL WARN NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: No such file or directory No plugin found (libnccl-net.so), using internal implementation",
        ],
        severity="error",
        priority=45,
    ),
    _sig(
        "nccl-shm-failure",
        "nccl_error",
        "system_software",
        r"(?:Error while creating shared memory segment|"
        r"unable to allocate shared memory|No space left on device.*(?:shm|nccl)|"
        r"nccl-shm.*(?:failed|error)|/dev/shm.*(?:too small|No space))",
        [
            "include/shm.h:48 NCCL WARN Error while creating shared memory segment nccl-shm-recv-c43b846667d22574-1-1-0 (size 9637888)",
        ],
        ["NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct"],
        priority=58,
    ),
    # ------------------------------------------------------------------ nccl_timeout
    _sig(
        "nccl-watchdog-timeout",
        "nccl_timeout",
        "unknown",
        r"(?:Watchdog caught collective operation timeout|"
        r"collective operation timeout: WorkNCCL|"
        r"Some NCCL operations have failed or timed out|"
        r"Heartbeat monitor timed out|watchdog got stuck for \d+ seconds|"
        r"Timeout\(ms\)=\d+\) ran for|NCCL timeout|"
        r"(?:Socket|Store) Timeout|torch\.distributed\.DistStoreError: .*[Tt]imeout|"
        r"Timed out waiting \d+ms for (?:recv|send) operation|"
        r"RuntimeError: Timed out initializing process group|"
        r"wait timeout after \d+ms|DistNetworkError: .*timed out)",
        [
            "[E ProcessGroupNCCL.cpp:458] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=96120, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 25624887 milliseconds before timing out.",
            "[rank0]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 0] Heartbeat monitor timed out! Process will be terminated after dumping debug info. workMetaList_.size()=1",
            "[Rank 1] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
        ],
        ["NCCL_TIMEOUT=1800", "init_process_group(backend='nccl', timeout=timedelta(minutes=30))"],
        role=SYMPTOM,
    ),
    # ------------------------------------------------------------------ cuda_error_app
    _sig(
        "cuda-device-assert",
        "cuda_error_app",
        "application",
        r"(?:device-side assert triggered|Assertion `[^`]*` failed|"
        r"CUDA error: device-side assert|cudaErrorAssert)",
        [
            "../aten/src/ATen/native/cuda/Indexing.cu:1308: indexSelectLargeIndex: block: [58,0,0], thread: [99,0,0] Assertion `srcIndex < srcSelectDimSize` failed.",
            "RuntimeError: CUDA error: device-side assert triggered",
        ],
        ["Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."],
        priority=78,
    ),
    _sig(
        "cuda-error-kernel",
        "cuda_error_app",
        "unknown",
        r"(?:CUDA error: (?:an illegal memory access|an illegal instruction|misaligned address|"
        r"invalid configuration argument|invalid argument|invalid device function|"
        r"no kernel image is available|unspecified launch failure|"
        r"the launch timed out|too many resources requested|operation not permitted|"
        r"invalid device ordinal|out of range|CUBLAS_STATUS|CUDNN_STATUS|"
        r"an illegal|initialization error|unknown error|operation not supported)|"
        r"CUBLAS_STATUS_(?:EXECUTION_FAILED|INTERNAL_ERROR|NOT_SUPPORTED|INVALID_VALUE|"
        r"ARCH_MISMATCH|NOT_INITIALIZED|ALLOC_FAILED)|"
        r"CUDNN_STATUS_(?:EXECUTION_FAILED|INTERNAL_ERROR|BAD_PARAM|NOT_SUPPORTED|MAPPING_ERROR)|"
        r"cudaErrorIllegalAddress|cudaErrorLaunchFailure|cudaErrorIllegalInstruction|"
        r"CUDA_ERROR_ILLEGAL_ADDRESS|CUDA_ERROR_LAUNCH_FAILED|illegal memory access|"
        r"Cuda failure \d+ '|CUDA kernel launch failed|an illegal memory access was encountered)",
        [
            "torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
            "RuntimeError: CUDA error: misaligned address",
            "RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx( handle, opa, opb, m, n, k, &falpha, a, CUDA_R_16F, lda, b, CUDA_R_16F, ldb, &fbeta, c, CUDA_R_16F, ldc, CUDA_R_32F, CUBLAS_GEMM_DFALT_TENSOR_OP)`",
            "RuntimeError: CUDA error: no kernel image is available for execution on the device",
        ],
        [
            "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
            "For debugging consider passing CUDA_LAUNCH_BLOCKING=1.",
        ],
    ),
    _sig(
        "cuda-driver-mismatch",
        "cuda_error_app",
        "system_software",
        r"(?:CUDA driver version is insufficient|forward compatibility was attempted|"
        r"NVIDIA driver on your system is too old|Found no NVIDIA driver|"
        r"CUDA initialization: .*(?:error|failed)|cudaErrorInsufficientDriver|"
        r"libcuda\.so.*cannot open|CUDA error: system not yet initialized|"
        r"undefined symbol: .*(?:cuda|nccl|cublas))",
        [
            "RuntimeError: The NVIDIA driver on your system is too old (found version 11040).",
            "RuntimeError: CUDA error: CUDA driver version is insufficient for CUDA runtime version",
            "UserWarning: CUDA initialization: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling NumCudaDevices() that might have already set an error? Error 802: system not yet initialized",
        ],
        ["CUDA driver version: 12.2"],
        priority=77,
    ),
    # ------------------------------------------------------------------ gpu_oom
    _sig(
        "cuda-out-of-memory",
        "gpu_oom",
        "application",
        r"(?:CUDA out of memory|OutOfMemoryError: CUDA|CUDA error: out of memory|"
        r"cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED|"
        r"RESOURCE_EXHAUSTED: Out of memory while trying to allocate|"
        r"HIP out of memory|NCCL WARN Cuda failure 'out of memory'|"
        r"failed to allocate \d+(?:\.\d+)? [KMG]i?B.*(?:device|GPU|CUDA)|"
        r"torch\.OutOfMemoryError|CUDNN_STATUS_ALLOC_FAILED)",
        [
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 388.00 MiB. GPU 0 has a total capacity of 9.68 GiB of which 95.75 MiB is free.",
            "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 37631.79 GiB (GPU 3; 79.21 GiB total capacity; 50.52 GiB already allocated; 24.67 GiB free; 52.32 GiB reserved in total by PyTorch)",
            "RuntimeError: CUDA error: out of memory",
        ],
        ["max_split_size_mb:512", "memory: 30.12GiB(38.09%)  tps: 5,231"],
    ),
    # ------------------------------------------------------------------ host_oom
    _sig(
        "kernel-oom-killer",
        "host_oom",
        "application",
        r"(?:Out of memory: Killed process|invoked oom-killer|oom-kill:|"
        r"Memory cgroup out of memory|oom_reaper: reaped process|"
        r"Some of your processes may have been killed by the cgroup out-of-memory handler|"
        r"detected \d+ oom[_-]kill events?|OOM Killed|OOMKilled|"
        r"exceeded (?:job )?memory limit|killed by the OOM killer)",
        [
            "kernel: Out of memory: Killed process 12345 (python) total-vm:123456kB, anon-rss:98765kB",
            "slurmstepd: error: Detected 1 oom_kill event in StepId=123.0. Some of your processes may have been killed by the cgroup out-of-memory handler.",
            "python invoked oom-killer: gfp_mask=0x100cca(GFP_HIGHUSER_MOVABLE), order=0, oom_score_adj=0",
        ],
        ["oom_score_adj=0 set for training process"],
        caseless=True,
    ),
    _sig(
        "dataloader-worker-killed",
        "host_oom",
        "application",
        r"(?:DataLoader worker \(pid \d+\) is killed by signal: Killed|"
        r"DataLoader worker \(pid\(s\) [^)]*\) exited unexpectedly|"
        r"Cannot allocate memory|std::bad_alloc|\bMemoryError\b|"
        r"unable to mmap \d+ bytes|(?:^|\]:? )Killed\s*$|line \d+:\s+\d+ Killed)",
        [
            "RuntimeError: DataLoader worker (pid 2637) is killed by signal: Killed.",
            "Killed",
            "MemoryError: Unable to allocate 3.2 GiB for an array with shape (1024, 1024, 800)",
            "OSError: [Errno 12] Cannot allocate memory",
            "/var/spool/slurmd/job123/slurm_script: line 20: 12345 Killed                  python train.py",
        ],
        [
            "Killed process group cleanly",
            "killed by signal: Segmentation fault",
            "torch.OutOfMemoryError: CUDA out of memory.",
            "srun: error: node07: tasks 0-7: Killed",
        ],
        priority=83,
    ),
    _sig(
        "sigkill-child",
        "host_oom",
        "unknown",
        r"(?:Signal 9 \(SIGKILL\) received|exitcode\s*:?\s*-9\b|failed \(exitcode: -9\)|"
        r"died with <Signals\.SIGKILL: 9>|exited with code 137|exit code 137|"
        r"terminated by signal 9|Killed by signal 9)",
        [
            "traceback : Signal 9 (SIGKILL) received by PID 14750",
            "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 0 (pid: 1234) of binary: /usr/bin/python",
        ],
        ["exitcode  : -11 (pid: 6421)"],
        role=WRAPPER,
        severity="error",
        priority=14,
        description="A child killed with SIGKILL: usually the OOM killer, sometimes the scheduler.",
        reports_exit=True,
    ),
    # ------------------------------------------------------------------ storage_io
    _sig(
        "storage-errno",
        "storage_io",
        "system_software",
        r"(?:Input/output error|\[Errno 5\]|Stale file handle|\[Errno 116\]|"
        r"No space left on device|\[Errno 28\]|Disk quota exceeded|\[Errno 122\]|"
        r"Read-only file system|\[Errno 30\]|Transport endpoint is not connected|"
        r"Remote I/O error|\[Errno 121\]|Structure needs cleaning|"
        r"PytorchStreamWriter failed writing file|PytorchStreamReader failed reading|"
        r"file write failed|unexpected pos \d+ vs \d+|"
        r"Lustre(?:Error)?:.*(?:failed|error|evict)|LustreError|"
        r"nfs: server \S+ not responding|NFS: .*(?:error|timed out)|"
        r"blk_update_request: I/O error|Buffer I/O error|EXT4-fs error|XFS .*error|"
        r"gpfs.*(?:error|failed)|mmfs.*(?:error|failed)|"
        r"Errno 52|Connection to the filesystem lost|fsspec.*(?:Timeout|IOError))",
        [
            "RuntimeError: write(): fd 29 failed with Input/output error",
            "OSError: [Errno 116] Stale file handle",
            "RuntimeError: [enforce fail at inline_container.cc:471] . PytorchStreamWriter failed writing file data/228: file write failed",
            "OSError: [Errno 28] No space left on device: '/checkpoints/step_2000'",
            "LustreError: 11-0: scratch-OST0007-osc-ffff8800: operation ost_write to node 10.0.0.7@o2ib failed: rc = -107",
            "nfs: server fileserver01 not responding, still trying",
        ],
        ["Saved checkpoint to /checkpoints/step_2000", "nfs: server fileserver01 OK"],
    ),
    # ------------------------------------------------------------------ scheduler_event
    _sig(
        "slurm-time-limit",
        "scheduler_event",
        "application",
        r"(?:CANCELLED AT \S+ DUE TO TIME LIMIT|DUE TO TIME LIMIT \*\*\*|"
        r"Job \d+ exceeded (?:its )?time limit|TIMEOUT: job exceeded|"
        r"time limit exceeded|slurmstepd: .*JOB \d+ .*TIME LIMIT)",
        [
            "slurmstepd: error: *** STEP 55595933.0 ON maestro-3017 CANCELLED AT 2025-01-10T15:27:25 DUE TO TIME LIMIT ***",
            "slurmstepd: error: *** JOB 4226796 ON eos0117 CANCELLED AT 2025-12-03T14:53:02 DUE TO TIME LIMIT ***",
        ],
        ["#SBATCH --time=04:00:00", "Job has not timed out. Ran 1 minutes out of requested 20"],
        caseless=True,
        reports_exit=True,
    ),
    _sig(
        "slurm-preempted",
        "scheduler_event",
        "system_software",
        r"(?:DUE TO PREEMPTION|this job is preempted|job (?:was|has been) preempted|"
        r"JOB REQUEUE|job requeued|Requeuing job|requeued due to|"
        r"CANCELLED AT \S+ DUE TO JOB REQUEUE|"
        r"Caught signal SIGUSR[12].*(?:preempt|requeue)|preemption signal|"
        r"SLURM_JOB_REQUEUE|Received SIGUSR1.*requeue)",
        [
            "submitit WARNING (2022-07-12 04:18:45,881) - Caught signal SIGHUP on learnfair0293: this job is preempted.",
            "slurmstepd: error: *** JOB 123456 ON gpu-001 CANCELLED AT 2025-01-10T15:27:25 DUE TO PREEMPTION ***",
        ],
        ["--requeue flag set", "preemption mode: off"],
        caseless=True,
    ),
    _sig(
        "slurm-node-failure",
        "scheduler_event",
        "hardware",
        r"(?:DUE TO NODE FAILURE|JOB \d+ ON \S+ CANCELLED .*NODE FAIL|"
        r"srun: error: Node failure on|Node \S+ not responding, setting DOWN|"
        r"job .* NODE_FAIL|slurmstepd: error: .*Kill task failed|"
        r"srun: error: .*: task \d+: Exited with exit code 1.*NODE_FAIL)",
        [
            "slurmstepd: error: *** JOB 48213 ON gpu-a100-007 CANCELLED AT 2026-11-28T03:14:15 DUE TO NODE FAILURE ***",
            "srun: error: Node failure on gpu-a100-007",
        ],
        ["Node gpu-a100-007 now responding"],
        priority=95,
        reports_exit=True,
    ),
    _sig(
        "slurm-cancelled",
        "scheduler_event",
        "unknown",
        r"(?:\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+ \*\*\*|"
        r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+ DUE TO SIGNAL)",
        [
            "slurmstepd: error: *** JOB 4211 ON node01 CANCELLED AT 2025-03-02T10:00:00 ***",
            "slurmstepd: error: *** STEP 4211.0 ON node01 CANCELLED AT 2025-03-02T10:00:00 ***",
        ],
        ["scancel --signal=USR1 4211"],
        severity="error",
        priority=35,
        role=SYMPTOM,
        description="Cancelled by someone or something: a person, an admin, or srun ending a "
        "step after one of its tasks failed. The cause, if any, is elsewhere.",
        reports_exit=True,
    ),
    # ------------------------------------------------------------------ segfault
    _sig(
        "segmentation-fault",
        "segfault",
        "unknown",
        r"(?:Segmentation fault|SIGSEGV|Signal 11 \(SIGSEGV\)|exitcode\s*:?\s*-11\b|"
        r"failed \(exitcode: -11\)|Fatal Python error: Segmentation|"
        r"segfault at [0-9a-f]+ ip|general protection fault|"
        r"Illegal instruction \(core dumped\)|SIGILL|"
        r"double free or corruption|free\(\): invalid pointer|malloc\(\): corrupted|"
        r"stack smashing detected)",
        [
            "traceback : Signal 11 (SIGSEGV) received by PID 6421",
            "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -11) local_rank: 0 (pid: 2012686) of binary: /gpfs/users/me/envs/ifseg/bin/python",
            "Segmentation fault (core dumped)",
            "python[1234]: segfault at 0 ip 00007f8b sp 00007ffd error 4 in libc.so.6",
        ],
        ["exitcode  : 1 (pid: 37881)", "Fault tolerance enabled", "segment 11 of 20 loaded"],
    ),
    _sig(
        "process-aborted",
        "segfault",
        "unknown",
        r"(?:SIGABRT|Signal 6 \(SIGABRT\)|exitcode\s*:?\s*-6\b|failed \(exitcode: -6\)|"
        r"Fatal Python error: Aborted|Aborted \(core dumped\)|"
        r"Bus error|SIGBUS|Signal 7 \(SIGBUS\)|exitcode\s*:?\s*-7\b|failed \(exitcode: -7\))",
        [
            "logging.cc:365: *** SIGABRT received at time=1735017785 on cpu 31 ***",
            "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -7) local_rank: 0 (pid: 37386) of binary: /home/jovyan/.conda/envs/glm/bin/python",
            "Aborted (core dumped)",
        ],
        ["exitcode  : 1 (pid: 37881)", "Training aborted by user request flag not set"],
        priority=25,
        description=(
            "An abort or bus error: often the end of a process whose real error came first "
            "(an NCCL watchdog exception aborts the process), so it ranks below collective "
            "timeouts."
        ),
    ),
    # ------------------------------------------------------------------ nan_divergence
    _sig(
        "loss-nan",
        "nan_divergence",
        "application",
        r"(?:[Ll]oss|[Nn]orm)['\"]?\s{0,3}[:=]\s{0,3}['\"]?[-+]?(?:nan|NaN|NAN|inf|Inf|INF)"
        r"(?:[^A-Za-z0-9]|$)|"
        r"[Ll]oss (?:is|became|has become) (?:nan|NaN|NAN|inf|Inf|not finite|infinite)|"
        r"[Nn]a[Nn] loss|[Dd]etected (?:nan|NaN|inf|Inf)|"
        r"(?:nan|NaN|inf|Inf) (?:or inf )?(?:detected|found) in|returned nan values|"
        r"non-finite (?:loss|value)|number of nan iterations:\s{0,8}[1-9]",
        [
            "loss scale: 1.0 | grad norm: nan |",
            " iteration      500/  250000 | lm loss: NaN | loss scale: 1.0 |",
            "{'loss': nan, 'grad_norm': nan, 'learning_rate': 4.9e-05, 'epoch': 0.3}",
            "RuntimeError: Function 'MulBackward0' returned nan values in its 0th output.",
            "number of skipped iterations:   0 | number of nan iterations:   3 |",
            "step: 120 loss: inf",
        ],
        [
            "number of skipped iterations: 0 | number of nan iterations: 0",
            "lm loss: 2.504220E+00 | grad norm: 0.231",
            "Infinity norm clipping enabled",
            "loss: 2.3 inference time 0.4s",
        ],
    ),
    _sig(
        "loss-scale-collapse",
        "nan_divergence",
        "application",
        r"(?:Minimum loss scale reached|Current loss scale already at minimum|"
        r"cannot decrease scale anymore|setting loss scale to: 0\.0|"
        r"loss_scale[ =:]+0(?:\.0+)?(?:\s|\||,|$)|loss scale: 0\.0+(?:\s|\||$)|"
        r"FloatingPointError: )",
        [
            "2020-03-23 11:41:18 | INFO | fairseq.trainer | NOTE: overflow detected, setting loss scale to: 0.00048828125",
            "FloatingPointError: Minimum loss scale reached (0.0001). Your loss is probably exploding.",
            "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.",
            "epoch 002 | loss 9.803 | gnorm 55.005 | loss_scale 0 | train_wall 4512",
        ],
        [
            "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768",
            "NOTE: overflow detected, setting loss scale to: 64.0",
            "loss_scale 128 | train_wall 30",
        ],
    ),
    # ------------------------------------------------------------------ app_exception
    _sig(
        GENERIC_EXCEPTION,
        "app_exception",
        "application",
        r"(?:[A-Z][A-Za-z0-9_]*Error|[A-Z][A-Za-z0-9_]*Exception|Exception)(?::\s|:$|$)",
        [
            "KeyError: 'input_ids'",
            "[rank15]: AssertionError: num_layers should be divisible by pipeline_model_parallel_size",
            "ValueError: Expected input batch_size (32) to match target batch_size (64).",
            "RuntimeError: Error(s) in loading state_dict for LlamaForCausalLM:",
            "torch._dynamo.exc.InternalTorchDynamoError: 'NoneType' object is not callable",
        ],
        [
            "ERROR:root:Evaluation skipped",
            "Using sdpa attention since ErrorCorrection is disabled",
            "TypeErrors are handled by the wrapper",
        ],
        severity="error",
        description="The last line of a Python traceback: the exception that ended the run.",
    ),
    _sig(
        "torch-state-dict-mismatch",
        "app_exception",
        "application",
        r"(?:Error\(s\) in loading state_dict for|size mismatch for \S+: copying a param with "
        r"shape|Missing key\(s\) in state_dict|Unexpected key\(s\) in state_dict)",
        [
            "Error(s) in loading state_dict for Linear:",
            "\tsize mismatch for weight: copying a param with shape torch.Size([0, 17]) from checkpoint, the shape in current model is torch.Size([1, 17]).",
            'Missing key(s) in state_dict: "model.embed_tokens.weight".',
        ],
        ["Loaded state_dict for Linear", "load_state_dict(strict=False)"],
        priority=62,
        description="A checkpoint that does not fit the model: a restart fails the same way.",
    ),
    _sig(
        "python-traceback",
        "app_exception",
        "application",
        r"Traceback \(most recent call last\):",
        ["Traceback (most recent call last):", "[rank0]: Traceback (most recent call last):"],
        ["Print the traceback of the last call", "traceback : Signal 11 (SIGSEGV)"],
        role=WRAPPER,
        severity="error",
        priority=8,
        description="A Python traceback whose exception line was not captured.",
    ),
    # ------------------------------------------------------------------ more, by category
    _sig(
        "nvidia-driver-unreachable",
        "gpu_hardware",
        "hardware",
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
    ),
    _sig(
        "cuda-device-unavailable",
        "cuda_error_app",
        "system_software",
        r"(?:CUDA-capable device\(s\) is/are busy or unavailable|all CUDA-capable devices are busy|"
        r"lib(?:cudart|cublas|cublasLt|cudnn|nccl|cuda|cufft|curand|cusparse|nvrtc)[A-Za-z0-9_]*"
        r"\.so[.0-9]*: cannot open shared object file|CUDNN_STATUS_NOT_INITIALIZED)",
        [
            "RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable",
            "ImportError: libcudart.so.11.0: cannot open shared object file: No such file or directory",
        ],
        ["Found libcudart.so.12 in /usr/local/cuda/lib64"],
        priority=77,
    ),
    _sig(
        "ib-completion-status",
        "interconnect",
        "unknown",
        r"(?:NET/IB ?: Got completion from peer \S+ with status=|IBV_WC_[A-Z_]+_ERR|"
        r"NET/IB ?: .*(?:failed|error)|Cable unplugged|port module event: .*(?:unplugged|error)|"
        r"NET/OFI .*(?:failed|error)|fi_[a-z_]+ failed|libfabric.*(?:error|failed))",
        [
            "NCCL WARN NET/IB: Got completion from peer 10.0.0.2<45678> with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_RECV(128) reqSize=0 vendor_err=129 req_type=Recv hca mlx5_1",
            "mlx5_core 0000:5e:00.0: Port module event: module 0, Cable unplugged",
        ],
        [
            "NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.1.2.3<0>",
            "Port module event: module 0, Cable plugged",
        ],
    ),
    _sig(
        "nccl-error-legacy",
        "nccl_error",
        "unknown",
        r"(?:NCCL Error \d+: |NCCL WARN Duplicate GPU detected|"
        r"NCCL WARN Error : ring \d+ does not loop back|ncclCommInitRank failed)",
        [
            "RuntimeError: NCCL Error 2: unhandled system error",
            "NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1b000",
        ],
        ["NCCL INFO Connected all rings"],
        priority=54,
    ),
    _sig(
        "peer-connection-lost",
        "nccl_error",
        "unknown",
        r"(?:Connection closed by peer|Connection reset by peer.*(?:nccl|NCCL|gloo|c10d)|"
        r"gloo/transport/tcp/pair\.cc:\d+\] (?:Connection closed|Read error|Timed out))",
        [
            "RuntimeError: [/opt/conda/conda-bld/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.0.0.3]:36472",
            "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:47398: Connection reset by peer",
        ],
        ["NCCL INFO Connected all rings", "gloo: connection to peer established"],
        priority=53,
        role=SYMPTOM,
        description="The rank that prints this lost a peer: the cause is on the peer's side "
        "(its process died, its node failed) or in the network between them.",
    ),
    _sig(
        "distributed-setup-timeout",
        "nccl_timeout",
        "unknown",
        r"(?:Timed out after \d+ seconds waiting for clients|RendezvousTimeoutError|"
        r"Timeout at NCCL work: \d+|Timed out waiting for barrier|"
        r"monitoredBarrier.*(?:timed out|failed)|failed to reach monitoredBarrier)",
        [
            "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.",
            "[PG 0 Rank 2] Timeout at NCCL work: 52817, last enqueued NCCL work: 52818, last completed NCCL work: 52816.",
        ],
        ["barrier() completed in 0.2 s"],
        role=SYMPTOM,
    ),
    _sig(
        "srun-out-of-memory",
        "host_oom",
        "application",
        r"(?:task \d+: Out Of Memory|DefaultCPUAllocator: can't allocate memory|"
        r"insufficient shared memory \(shm\)|Unexpected bus error encountered in worker)",
        [
            "srun: error: gpu-a100-003: task 5: Out Of Memory",
            "RuntimeError: [enforce fail at alloc_cpu.cpp:83] data. DefaultCPUAllocator: can't allocate memory: you tried to allocate 3221225472 bytes. Error code 12 (Cannot allocate memory)",
            "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).",
        ],
        ["srun: error: gpu-a100-003: task 5: Exited with exit code 1"],
        priority=85,
        reports_exit=True,
    ),
    _sig(
        "storage-remote",
        "storage_io",
        "system_software",
        r"(?:unable to lock file|ReadTimeoutError: Read timeout on endpoint|"
        r"EndpointConnectionError: Could not connect to the endpoint|"
        r"failed finding central directory|Unable to open file \(file read failed|"
        r"Bad file descriptor.*(?:checkpoint|ckpt)|OSError: \[Errno 5\])",
        [
            "BlockingIOError: [Errno 11] Unable to synchronously open file (unable to lock file, errno = 11, error message = 'Resource temporarily unavailable')",
            "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory",
            'botocore.exceptions.ReadTimeoutError: Read timeout on endpoint URL: "https://s3.us-east-1.amazonaws.com/bucket/shard-0001.tar"',
        ],
        ["Opened zip archive with central directory at offset 12"],
    ),
    _sig(
        "slurm-killed-stuck",
        "scheduler_event",
        "system_software",
        r"(?:DUE TO JOB NOT ENDING WITH SIGNALS|srun: error: Unable to allocate resources|"
        r"this job is timed[- ]out|job (?:has )?timed out after)",
        [
            "slurmstepd: error: *** JOB 4211 STEPD TERMINATED ON node01 AT 2025-03-02T10:00:00 DUE TO JOB NOT ENDING WITH SIGNALS ***",
            "srun: error: Unable to allocate resources: Requested node configuration is not available",
        ],
        ["srun: job 4211 has been allocated resources"],
    ),
    _sig(
        "submitit-timeout",
        "scheduler_event",
        "application",
        r"(?:this job is timed[- ]out|Job has timed out|timed out, requeuing)",
        [
            "submitit WARNING (2023-01-01 00:00:00,000) - Caught signal SIGUSR2 on node12: this job is timed-out."
        ],
        ["Job has not timed out. Ran 1 minutes out of requested 20 minutes."],
    ),
    _sig(
        "signal-exit-codes",
        "segfault",
        "unknown",
        r"(?:exited on signal 11|exit code 139|exited with code 139|"
        r"(?:with|by) signal 11\b|killed by signal: Segmentation fault)",
        [
            "mpirun noticed that process rank 3 with PID 0 on node gpu-1 exited on signal 11 (Segmentation fault).",
            "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Segmentation fault.",
            "Process finished with exit code 139",
        ],
        ["exit code 1", "exited on signal 15 (Terminated)"],
    ),
    _sig(
        "loss-divergence-extra",
        "nan_divergence",
        "application",
        r"(?:NaN in local grad norm|found NaN in|[Gg]rad(?:ient)?[_ ]norm (?:is|became) (?:nan|NaN|inf)|"
        r"[Ll]oss (?:spike|diverged|exploded)|training diverged)",
        [
            "Rerun state machine: found NaN in local grad norm in backward pass before data-parallel communication collective",
            "Gradient norm is nan at step 1200, aborting",
        ],
        ["grad norm: 0.98", "no NaN found in batch"],
    ),
    _sig(
        "python-exception-ignored",
        "app_exception",
        "application",
        r"(?:Exception ignored in|Error in atexit\._run_exitfuncs)",
        ["Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f>"],
        ["Exception raised from checkTimeout"],
        severity="warning",
        priority=5,
        description="Python reporting an exception it ignored, usually at shutdown: not a failure.",
    ),
    _sig(
        "dist-network-error",
        "nccl_error",
        "unknown",
        r"DistNetworkError",
        [
            "torch.distributed.DistNetworkError: Connection reset by peer",
            "torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection was likely closed.",
        ],
        ["DistributedSampler initialised"],
        priority=29,
        role=SYMPTOM,
        description="The c10d store lost its peer: usually a consequence of another rank dying.",
    ),
    _sig(
        "too-many-open-files",
        "storage_io",
        "system_software",
        r"(?:Too many open files|\[Errno 24\])",
        ["OSError: [Errno 24] Too many open files"],
        ["ulimit -n 65536 set"],
    ),
    # ------------------------------------------------------------------ wrappers
    _sig(
        "torchelastic-child-failed",
        "app_exception",
        "application",
        r"(?:ChildFailedError|torch\.distributed\.elastic\.multiprocessing\.api:failed \(exitcode: |"
        r"Root Cause \(first observed failure\)|"
        r"subprocess\.CalledProcessError: Command .* returned non-zero exit status|"
        r"exits with return code = -?\d+|Process \d+ exited with code -?\d+|"
        r"exitcode\s*:\s*-?\d+ \(pid)",
        [
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
            "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 (pid: 1) of binary: /usr/bin/python3",
        ],
        ["exit code: 0"],
        role=WRAPPER,
        severity="error",
        priority=10,
        reports_exit=True,
    ),
    _sig(
        "srun-task-exited",
        "app_exception",
        "application",
        r"(?:srun: error: \S+: tasks? [0-9,-]+: (?:Exited with exit code \d+|Killed|"
        r"Terminated|Segmentation fault|Aborted)|srun: error: Timed out waiting for job step|"
        r"srun: Job step aborted|srun: error: .*launch failed|"
        r"srun: error: Unable to create step|srun: error: task \d+ launch failed)",
        [
            "srun: error: gpu-a100-003: task 12: Exited with exit code 1",
            "srun: error: node07: tasks 0-7: Killed",
            "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.",
        ],
        ["srun: job 1234 queued and waiting for resources", "srun: Step created for job 1234"],
        role=WRAPPER,
        severity="error",
        priority=9,
        reports_exit=True,
    ),
]
