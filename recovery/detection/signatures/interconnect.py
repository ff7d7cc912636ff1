"""Signatures of the fabric between GPUs and nodes: InfiniBand verbs and Mellanox driver errors,
libfabric (NET/OFI), NVLink and NVSwitch faults, and NCCL saying a peer or the network failed.
"""

from __future__ import annotations

from recovery.detection.signatures.base import Signature, define
from recovery.detection.taxonomy import Attribution, FailureCategory

SIGNATURES: tuple[Signature, ...] = (
    define(
        "ib-completion-error",
        FailureCategory.INTERCONNECT,
        Attribution.UNKNOWN,
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
    define(
        "ib-async-fatal",
        FailureCategory.INTERCONNECT,
        Attribution.HARDWARE,
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
    define(
        "ib-async-event-failed",
        FailureCategory.INTERCONNECT,
        Attribution.UNKNOWN,
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
    define(
        "nvlink-error",
        FailureCategory.INTERCONNECT,
        Attribution.HARDWARE,
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
    define(
        "nccl-remote-error",
        FailureCategory.INTERCONNECT,
        Attribution.UNKNOWN,
        r"(?:ncclRemoteError|remote process exited or there was a network error)",
        [
            "torch.distributed.DistBackendError: NCCL error in: /opt/pytorch/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3763, remote process exited or there was a network error, NCCL version 2.28.8",
            "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
        ],
        ["NCCL INFO comm 0x55 rank 3 nranks 16 - Init COMPLETE"],
        priority=52,
        description="A peer died or the network failed: weaker than evidence naming either.",
    ),
    define(
        "ib-completion-status",
        FailureCategory.INTERCONNECT,
        Attribution.UNKNOWN,
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
)
