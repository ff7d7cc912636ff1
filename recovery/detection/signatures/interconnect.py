"""Signatures of the fabric between GPUs and nodes: InfiniBand verbs and Mellanox driver errors,
libfabric (NET/OFI), NVLink and NVSwitch faults, and NCCL saying a peer or the network failed.
"""

from __future__ import annotations

from recovery.detection.signatures.base import SYMPTOM, Signature, define
from recovery.detection.taxonomy import Attribution, FailureCategory

# Failures seen from the surviving side of a connection outrank NCCL's own generic errors (they
# say more: the network or a peer), never a cause printed by the failing rank (an exception, a
# segfault, an OOM).
PEER_REPORTED_PRIORITY = 57

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
        r"ibv_create_qp failed|RDMA_CM_EVENT_(?:UNREACHABLE|REJECTED|ADDR_ERROR))",
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
        "net-plugin-setup-failed",
        FailureCategory.INTERCONNECT,
        Attribution.SYSTEM_SOFTWARE,
        r"(?:fi_getinfo\(\) call failed|ibv_reg_mr(?:_iova2?|_dmabuf_mr)? failed|"
        r"Unable to register memory|Failed to initialize any NET plugin|"
        r"NET/OFI (?:Unable to|Failed to) (?:initialize|create|open|find|register))",
        [
            "nccl_net_ofi_rdma_init:7978 NCCL WARN NET/OFI OFI fi_getinfo() call failed: No data available",
            "register_rail_mr_buffer:617 NCCL WARN NET/OFI Unable to register memory (type = 2) for device 4. RC: -22, Error: Invalid argument",
            "NCCL WARN Call to ibv_reg_mr failed with error Cannot allocate memory",
            "NCCL WARN Failed to initialize any NET plugin",
        ],
        ["NCCL INFO NET/OFI Selected provider is efa, fabric is efa (found 4 nics)"],
        priority=91,
        description="The network library could not set up the fabric: a provider or device not "
        "exposed to the job, memory that cannot be pinned (memlock limits, a missing peer-memory "
        "or dma-buf driver), a broken libfabric. The node's software, not its link.",
        printed_by="NCCL's IB transport (ibv_reg_mr) and the aws-ofi-nccl plugin (NET/OFI fi_getinfo, memory registration)",
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
        printed_by="the NVIDIA driver's NVLink reports (NVRM), the NVSwitch driver's SXid reports and NVIDIA Fabric Manager",
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
        role=SYMPTOM,
        priority=PEER_REPORTED_PRIORITY,
        implicates_nodes=False,
        description="NCCL's ncclRemoteError: a peer died or the network between them failed. "
        "Weaker than evidence naming either, and the node that prints it is a witness.",
        printed_by="NCCL (ncclRemoteError) and PyTorch's ProcessGroupNCCL error text",
    ),
    define(
        "nccl-socket-peer-lost",
        FailureCategory.INTERCONNECT,
        Attribution.UNKNOWN,
        # NCCL's socket layer by its function names, with or without the WARN prefix (a
        # DistBackendError quotes it as its "Last error").
        r"(?:NCCL WARN (?:socketStartConnect: |Net : )?Connect to \S+ failed|"
        r"socketStartConnect: Connect to \S+ failed|socketTryAccept: Accept failed|"
        r"NCCL WARN (?:socketProgress: |Net : )?Connection closed by remote peer|"
        r"Call to recv from \S+ failed|Socket recv failed while polling)",
        [
            "misc/socket.cc:483 NCCL WARN socketStartConnect: Connect to 10.0.0.2<45763> failed : Software caused connection abort",
            "include/socket.h:390 NCCL WARN Connect to 10.38.10.112<21724> failed : Connection refused",
            "misc/socket.cc:521 NCCL WARN Net : Connection closed by remote peer 10.104.148.191<37877>",
            "a100-st-p4d24xlarge-22:183006:183220 [1] misc/socket.cc:518 NCCL WARN Net : Call to recv from 10.200.84.247<58355> failed : Broken pipe",
            "socketProgressOpt: Call to recv from 172.16.0.4<33759> failed : Connection reset by peer",
        ],
        [
            "NCCL INFO Call to connect returned Connection refused, retrying",
            "NCCL INFO Bootstrap : Using ib0:10.1.2.3<0>",
        ],
        role=SYMPTOM,
        priority=PEER_REPORTED_PRIORITY,
        implicates_nodes=False,
        description="NCCL's socket layer (bootstrap, proxy, NET/Socket) could not reach a peer or "
        "lost it. Printed on the side that is still alive, so it names no node to blame.",
        printed_by="NCCL's socket layer (misc/socket.cc, proxy.cc: socketStartConnect, socketProgress)",
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
    define(
        "libfabric-provider-error",
        FailureCategory.INTERCONNECT,
        Attribution.UNKNOWN,
        # A completion queue's error handler or a provider's own errno; libfabric's <warn>
        # lines elsewhere (xpmem, device probing at start-up) are not failures.
        r"(?:prov_errno|libfabric:\d+:\d+::[a-z0-9_]+:cq:.*<(?:warn|error)>|fi_cq_readerr|"
        r"Unable to write to EQ|efa_rdm_[a-z_]+_handle_error|rxr_cq_handle_[a-z_]*error|"
        r"Couldn't find any optimal provider|EFA libfabric provider not detected)",
        [
            "Unable to write to EQ: Missing or unavailable event queue. err: Input/output error (5) prov_errno: Unknown error -12 (-12) prov/efa/src/rxr/rxr.h:1343",
            "libfabric:451707:1708520807::efa:cq:efa_rdm_txe_handle_error():737<warn> err: 5, message: Invalid address",
        ],
        [
            "libfabric:12345:1700000000::core:core:ofi_register_provider():474<info> registering provider: efa (1.0)"
        ],
        priority=91,
        description="libfabric's providers (EFA, verbs, tcp, CXI) reporting a failed operation: "
        "the fabric's own layer, whatever errno it carries.",
        printed_by='libfabric\'s provider logs ("libfabric:PID:TIME::efa:cq:...<warn>", '
        'prov_errno) and aws-ofi-nccl ("NET/OFI")',
    ),
    define(
        "ibv-call-failed",
        FailureCategory.INTERCONNECT,
        Attribution.UNKNOWN,
        # Calls that set up or run a connection; probing devices at start-up (ibv_open_device,
        # ibv_query_*) fails harmlessly where NCCL falls back to sockets.
        r"(?:Call to ibv_(?:create_[a-z]+|reg_[a-z0-9_]+|modify_qp|post_[a-z]+|poll_cq|alloc_pd|"
        r"req_notify_cq) failed|\bibv_(?:create_[a-z]+|reg_[a-z0-9_]+|modify_qp|post_[a-z]+|"
        r"poll_cq|alloc_pd)(?:\(\))? (?:failed|returned error)|cannot create (?:cq|qp|srq)\b|"
        r"[Ff]ailed to modify QP to (?:INIT|RTR|RTS)|rdma_[a-z_]+(?:\(\))? failed)",
        [
            "host:4016:4653 [7] misc/ibvwrap.cc:190 NCCL WARN Call to ibv_create_cq failed with error Cannot allocate memory",
            "Failed to modify QP to RTR: Connection timed out",
            "hai-a100-3:3778851:3779883 [4] ibvwrap.c:130 NCCL WARN Call to ibv_create_qp failed",
        ],
        [
            "ibv_devinfo: hca_id mlx5_0 transport InfiniBand (0)",
            "Call to ibv_open_device succeeded",
        ],
        priority=90,
        description="An InfiniBand verbs or RDMA-CM call that failed. Out of memory on it is "
        "the locked-memory limit (ulimit -l) or the HCA's resources: the system's setup.",
        printed_by='libibverbs callers: NCCL\'s ibvwrap ("Call to ibv_... failed"), '
        'perftest and RDMA tools ("Failed to modify QP to RTR")',
    ),
)
