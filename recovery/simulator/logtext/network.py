"""What fabric and collective failures write: NCCL errors, InfiniBand links and NICs, timeouts."""

from __future__ import annotations

from recovery.simulator.logtext.context import (
    FailureContext,
    rank_block,
    srun_exit,
    step_cancelled,
    traceback_lines,
    train_frames,
    watchdog_timeouts,
)
from recovery.simulator.logtext.layout import (
    GPUS_PER_NODE,
    NCCL_VERSION,
    NIC_BUSES,
    host_line,
    node_ip,
    random_pid,
    rank_line,
)


def nccl_error(context: FailureContext) -> list[str]:
    rng = context.rng
    gpu = context.gpu()
    rank = context.rank_of(gpu)
    pid = random_pid(rng)
    lines = [
        rank_line(
            rank,
            context.at,
            context.host,
            f"{context.host}:{pid}:{pid + rng.randint(50, 400)} [{gpu}] "
            f"{rng.choice(('include/alloc.h:102', 'transport.cc:154', 'enqueue.cc:1008'))} NCCL "
            "WARN Cuda failure 'invalid argument'",
        )
    ]
    body = [
        *traceback_lines(train_frames(rng)),
        "torch.distributed.DistBackendError: NCCL error in: /opt/pytorch/pytorch/torch/csrc/"
        f"distributed/c10d/ProcessGroupNCCL.cpp:{rng.choice((1970, 2027, 3763))}, unhandled system "
        f"error (run with NCCL_DEBUG=INFO for details), NCCL version {NCCL_VERSION}",
        "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or "
        "device error.",
    ]
    lines += rank_block(context, rank, context.host, body, context.at + 0.2)
    lines += srun_exit(context, rank, context.host)
    lines.append(step_cancelled(context))
    return lines


def ib_link(context: FailureContext) -> list[str]:
    rng = context.rng
    gpu = context.gpu()
    rank = context.rank_of(gpu)
    pid = random_pid(rng)
    peer_host = context.hosts[(context.node + 1) % len(context.hosts)]
    lines = []
    if rng.random() < 0.4:
        port = rng.randrange(4)
        lines.append(
            host_line(
                context.at - 1.5,
                context.host,
                f"mlx5_core 0000:{NIC_BUSES[port * 2]}:00.0 ib{port}: Link down",
            )
        )
    lines.append(
        rank_line(
            rank,
            context.at,
            context.host,
            f"{context.host}:{pid}:{pid + rng.randint(50, 400)} [{gpu}] transport/net_ib.cc:"
            f"{rng.choice((1696, 2089))} NCCL WARN NET/IB : Got completion from peer "
            f"{node_ip(peer_host)}<{rng.randint(30000, 60000)}> with error 12, opcode "
            f"{rng.choice((0, 1, 128))}, len 0, vendor err 129 (Recv) localGid ::ffff:"
            f"{node_ip(context.host)} remoteGid ::ffff:{node_ip(peer_host)}",
        )
    )
    body = [
        *traceback_lines(train_frames(rng)),
        "torch.distributed.DistBackendError: NCCL error in: /opt/pytorch/pytorch/torch/csrc/"
        "distributed/c10d/ProcessGroupNCCL.cpp:3763, remote process exited or there was a network "
        f"error, NCCL version {NCCL_VERSION}",
        "ncclRemoteError: A call failed possibly due to a network error or a remote process "
        "exiting prematurely.",
    ]
    lines += rank_block(context, rank, context.host, body, context.at + 0.3)
    lines += srun_exit(context, rank, context.host)
    lines.append(step_cancelled(context))
    return lines


def nic_fatal(context: FailureContext) -> list[str]:
    rng = context.rng
    gpu = context.gpu()
    rank = context.rank_of(gpu)
    bus = NIC_BUSES[rng.randrange(len(NIC_BUSES))]
    pid = random_pid(rng)
    lines = [
        host_line(
            context.at,
            context.host,
            f"mlx5_core 0000:{bus}:00.0: mlx5_health_report:{rng.choice((102, 123, 140))}:(pid "
            f"{rng.randint(100, 9000)}): device's health compromised - reached miss count",
        ),
        rank_line(
            rank,
            context.at + 0.4,
            context.host,
            f"{context.host}:{pid}:{pid + rng.randint(50, 400)} [{gpu}] transport/net_ib.cc:80 "
            "NCCL WARN NET/IB : Got async event : local catastrophic error",
        ),
    ]
    lines += watchdog_timeouts(context, rng.randint(1, 3), context.at + 1.0)
    lines += srun_exit(context, rank, context.host)
    lines.append(step_cancelled(context))
    return lines


def nccl_timeout(context: FailureContext) -> list[str]:
    rng = context.rng
    lines = watchdog_timeouts(context, rng.randint(2, 6), context.at)
    rank, host = context.peers(1)[0]
    lines += rank_block(
        context,
        rank,
        host,
        [
            f"[rank{rank}]:[E ProcessGroupNCCL.cpp:1595] [PG ID 0 PG GUID 0(default_pg) Rank "
            f"{rank}] Process group watchdog thread terminated with exception: [Rank {rank}] "
            "Watchdog caught collective operation timeout",
            "terminate called after throwing an instance of 'c10::DistBackendError'",
        ],
        context.at + 0.5,
    )
    lines.append(
        f"srun: error: {host}: tasks {rank - rank % GPUS_PER_NODE}-"
        f"{rank - rank % GPUS_PER_NODE + GPUS_PER_NODE - 1}: Aborted"
    )
    return lines
