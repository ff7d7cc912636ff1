"""Signatures of the collective layer: NCCL errors and warnings, collective and rendezvous
timeouts, and c10d or gloo losing a peer.

Most of these are symptoms: the rank that prints them waits on a peer that failed elsewhere.
"""

from __future__ import annotations

from recovery.detection.signatures.base import SYMPTOM, Signature, define
from recovery.detection.taxonomy import Attribution, FailureCategory, Severity

SIGNATURES: tuple[Signature, ...] = (
    define(
        "nccl-comm-aborted",
        FailureCategory.NCCL_ERROR,
        Attribution.UNKNOWN,
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
    define(
        "nccl-error-raised",
        FailureCategory.NCCL_ERROR,
        Attribution.UNKNOWN,
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
    define(
        "nccl-warn-fatal",
        FailureCategory.NCCL_ERROR,
        Attribution.UNKNOWN,
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
        severity=Severity.ERROR,
        priority=45,
    ),
    define(
        "nccl-shm-failure",
        FailureCategory.NCCL_ERROR,
        Attribution.SYSTEM_SOFTWARE,
        r"(?:Error while creating shared memory segment|"
        r"unable to allocate shared memory|No space left on device.*(?:shm|nccl)|"
        r"NCCL WARN Call to posix_fallocate failed|"
        r"nccl-shm.*(?:failed|error)|/dev/shm.*(?:too small|No space))",
        [
            "include/shm.h:48 NCCL WARN Error while creating shared memory segment nccl-shm-recv-c43b846667d22574-1-1-0 (size 9637888)",
        ],
        ["NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct"],
        # Above storage: the "No space left on device" it reports is /dev/shm, not a filesystem.
        priority=83,
    ),
    define(
        "nccl-watchdog-timeout",
        FailureCategory.NCCL_TIMEOUT,
        Attribution.UNKNOWN,
        r"(?:Watchdog caught collective operation timeout|"
        r"collective operation timeout: WorkNCCL|"
        r"Some NCCL operations have failed or timed out|"
        r"Heartbeat monitor timed out|watchdog got stuck for \d+ seconds|"
        r"Timeout\(ms\)=\d+\) ran for|NCCL timeout|"
        r"(?:Socket|Store) Timeout|torch\.distributed\.DistStoreError: .*[Tt]imeout|"
        r"Timed out waiting \d+ms for (?:recv|send) operation|"
        r"RuntimeError: Timed out initializing process group|"
        r"wait timeout after \d+ms|DistNetworkError: .*timed out|"
        # The watchdog's C++ frame that raises the timeout: a log cut before the message (or a
        # core's backtrace) still shows it.
        r"ProcessGroupNCCL::WorkNCCL::checkTimeout\()",
        [
            "[E ProcessGroupNCCL.cpp:458] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=96120, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 25624887 milliseconds before timing out.",
            "frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, std::ratio<1l, 1000l> > >) + 0x1d2 (0x1554e9e0f8f2 in /opt/conda/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so)",
            "[rank0]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 0] Heartbeat monitor timed out! Process will be terminated after dumping debug info. workMetaList_.size()=1",
            "[Rank 1] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
        ],
        ["NCCL_TIMEOUT=1800", "init_process_group(backend='nccl', timeout=timedelta(minutes=30))"],
        role=SYMPTOM,
    ),
    define(
        "nccl-error-legacy",
        FailureCategory.NCCL_ERROR,
        Attribution.UNKNOWN,
        r"(?:NCCL Error \d+: |NCCL WARN Duplicate GPU detected|"
        r"NCCL WARN Error : ring \d+ does not loop back|ncclCommInitRank failed)",
        [
            "RuntimeError: NCCL Error 2: unhandled system error",
            "NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1b000",
        ],
        ["NCCL INFO Connected all rings"],
        priority=54,
        printed_by='NCCL before 2.4 ("NCCL Error N:") and NCCL\'s init checks ("Duplicate GPU detected", ring checks)',
    ),
    define(
        "peer-connection-lost",
        FailureCategory.INTERCONNECT,
        Attribution.UNKNOWN,
        r"(?:Connection closed by peer|Connection reset by peer.*(?:nccl|NCCL|gloo|c10d)|"
        r"gloo/transport/tcp/pair\.cc:\d+\] (?:Connection closed|Read error|Timed out))",
        [
            "RuntimeError: [/opt/conda/conda-bld/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.0.0.3]:36472",
            "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:47398: Connection reset by peer",
        ],
        ["NCCL INFO Connected all rings", "gloo: connection to peer established"],
        priority=53,
        role=SYMPTOM,
        implicates_nodes=False,
        description="The rank that prints this lost a peer: the cause is on the peer's side "
        "(its process died, its node failed) or in the network between them.",
        printed_by="gloo's TCP transport (gloo/transport/tcp/pair.cc), through PyTorch",
    ),
    define(
        "distributed-setup-timeout",
        FailureCategory.NCCL_TIMEOUT,
        Attribution.UNKNOWN,
        r"(?:Timed out after \d+ seconds waiting for clients|RendezvousTimeoutError|"
        r"Timeout at NCCL work: \d+|Timed out waiting for barrier|"
        r"monitoredBarrier.*(?:timed out|failed)|failed to reach monitoredBarrier|"
        # JAX's coordination service and Horovod's stall inspector.
        r"DEADLINE_EXCEEDED: Barrier timed out|Barrier timed out\. Barrier_id|"
        r"waiting for remainder of ranks for more than \d+ seconds)",
        [
            "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.",
            "[PG 0 Rank 2] Timeout at NCCL work: 52817, last enqueued NCCL work: 52818, last completed NCCL work: 52816.",
        ],
        ["barrier() completed in 0.2 s"],
        role=SYMPTOM,
        printed_by="PyTorch's c10d store (DistStoreError), torchelastic's rendezvous (RendezvousTimeoutError) and ProcessGroupNCCL's monitoredBarrier and watchdog",
    ),
    define(
        "dist-network-error",
        FailureCategory.NCCL_ERROR,
        Attribution.UNKNOWN,
        r"DistNetworkError",
        [
            "torch.distributed.DistNetworkError: Connection reset by peer",
            "torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection was likely closed.",
        ],
        ["DistributedSampler initialised"],
        priority=29,
        role=SYMPTOM,
        description="The c10d store lost its peer: usually a consequence of another rank dying.",
        printed_by="PyTorch's c10d TCP store (torch.distributed.DistNetworkError)",
    ),
    define(
        "nccl-result",
        FailureCategory.NCCL_ERROR,
        Attribution.UNKNOWN,
        r"(?:NCCL operation nccl[A-Za-z]+(?:\([^)]{0,300}\))? failed|"
        r"(?:NCCL|Nccl|nccl) (?:[Ee]rror|failure)\s*\(?\d*\)?|ncclResult).{0,80}?"
        r"(?:unhandled cuda error|unhandled system error|internal error|invalid usage|"
        r"invalid argument|remote process exited|network error)",
        [
            "INTERNAL: external/xla/xla/service/gpu/nccl_utils.cc:275: NCCL operation ncclCommInitRank(&comm, nranks, id, rank) failed: unhandled cuda error",
            "OSError: (External) NCCL error(6), remote process exited or there was a network error.",
            "NCCL operation ncclAllReduce(send_buffer, recv_buffer, count, datatype, reduce_op, comm, stream) failed: invalid usage",
        ],
        ["NCCL operation ncclAllReduce completed", "NCCL error checking enabled"],
        priority=55,
        # The rank that prints a collective's result is reporting it, not its cause.
        implicates_nodes=False,
        description="NCCL's result code (ncclResult_t) in any framework's wrapper: the result's "
        "documented meaning decides (a remote process or the network, a system call, CUDA, "
        "misuse).",
        printed_by='NCCL\'s ncclGetErrorString results as XLA ("NCCL operation ... failed: "), '
        'PaddlePaddle ("NCCL error(N)") and PyTorch report them',
    ),
    define(
        "nccl-library-unavailable",
        FailureCategory.NCCL_ERROR,
        Attribution.SYSTEM_SOFTWARE,
        r"(?:Unable to load NCCL library|Failed to load NCCL|NCCL is not available|"
        r"libnccl\.so[.0-9]*: cannot open shared object file|"
        r"Distributed package doesn't have NCCL built in|NCCL version mismatch)",
        [
            "NCCL operation ncclGetUniqueId(&id) failed: Unable to load NCCL library. Multi-GPU collectives will not work.",
            "RuntimeError: Distributed package doesn't have NCCL built in",
        ],
        ["NCCL library loaded from /usr/lib/x86_64-linux-gnu/libnccl.so.2"],
        priority=56,
        description="The NCCL library is missing or does not fit the framework: an installation "
        "problem, not the job's code or the fabric.",
        printed_by='XLA ("Unable to load NCCL library") and PyTorch ("Distributed package '
        "doesn't have NCCL built in\")",
    ),
    define(
        "gloo-mesh-failed",
        FailureCategory.INTERCONNECT,
        Attribution.UNKNOWN,
        r"(?:Gloo connectFullMesh failed|gloo/transport/tcp/(?:pair|device|listener)\.cc:\d+\] "
        r"(?:connect \[|[Nn]o route to host|Network is unreachable))",
        [
            "[rank4]:[E421 02:05:38.764490322 ProcessGroupGloo.cpp:143] Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:144] no error",
            "RuntimeError: [/opt/gloo/gloo/transport/tcp/pair.cc:799] connect [10.0.0.2]:41234: Connection refused",
        ],
        ["Gloo connectFullMesh succeeded"],
        priority=88,
        implicates_nodes=False,
        description="Gloo cannot connect its ranks' TCP mesh: the network between hosts (or a "
        "peer that is gone), seen from the rank that printed it.",
        printed_by="Gloo's TCP transport (ProcessGroupGloo connectFullMesh, tcp/pair.cc)",
    ),
    define(
        "nccl-result-trace",
        FailureCategory.NCCL_ERROR,
        Attribution.UNKNOWN,
        # NCCL traces an error up its call stack, one "file.cc:line -> result" INFO line per
        # frame; the result is an ncclResult_t (1 CUDA, 2 system call, 3 internal, 4 invalid
        # argument, 5 invalid usage, 6 remote peer or network).
        r"NCCL INFO [A-Za-z0-9_./-]+\.(?:cc|c|h):\d+ -> [1-6]\b",
        [
            "host:4011:4581 [2] NCCL INFO transport/net.cc:304 -> 2",
            "d13186ffee3a:57:75 [0] NCCL INFO init.cc:876 -> 2",
            "host2:14508:15205 [0] NCCL INFO external/nccl_archive/src/transport.cc:163 -> 3 [Proxy Thread]",
        ],
        [
            "host:4011:4581 [2] NCCL INFO Channel 00 : 0[0] -> 1[1] via P2P/IPC",
            "NCCL INFO init.cc:876 -> 0",
        ],
        severity=Severity.ERROR,
        priority=20,
        implicates_nodes=False,
        description="NCCL's own trace of an error result through its call stack: an NCCL "
        "failure even where no exception line was captured; below any error that names what "
        "failed.",
        printed_by='NCCL\'s NCCLCHECK error tracing at NCCL_DEBUG=INFO ("file.cc:line -> result")',
    ),
    define(
        "rendezvous-connection-failed",
        FailureCategory.INTERCONNECT,
        Attribution.UNKNOWN,
        r"(?:RendezvousConnectionError|The connection to the C10d store has failed|"
        r"c10d_rendezvous_backend.*Connection (?:reset|refused))",
        [
            "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store has failed. See inner exception for details.",
            "WARNING:torch.distributed.elastic.rendezvous.dynamic_rendezvous:The node 'n_3140_0' has failed to shutdown the rendezvous 'r1' due to an error of type RendezvousConnectionError.",
        ],
        ["rendezvous backend: c10d, endpoint: node-1:29400"],
        priority=88,
        implicates_nodes=False,
        description="torchelastic losing its connection to the rendezvous store on another "
        "host: the network between hosts, or the host that serves the store.",
        printed_by="torchelastic's rendezvous (torch.distributed.elastic.rendezvous."
        "RendezvousConnectionError)",
    ),
)
