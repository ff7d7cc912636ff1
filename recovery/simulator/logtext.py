"""The text a simulated training job writes: start-up chatter, progress, checkpoints, failures.

Lines look like those of a real multi-node job started with ``srun -l``: srun puts the rank in
front, the program prints a timestamp and its host (like ``tests/e2e/jobs/ddp_train.py``)::

    8: 2026-11-29T18:00:01.123Z gpu-0007: step:   120  loss:  3.2100  memory: ...  tps: 5,231

NCCL prints ``host:pid:tid [gpu] NCCL INFO ...`` after the same prefixes, a node's kernel or
health monitor lines carry only the timestamp and host, and Slurm's own lines (``srun: error:``,
``slurmstepd-host: error: ***``) come without either, as Slurm writes them. Failure text is
built from templates per fault kind, with the ranks, hosts, PCI bus ids, pids and sequence
numbers of the job at hand, so that no two failures read alike.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from recovery.simulator.faults import FaultKind

GPUS_PER_NODE = 8
NCCL_VERSION = "2.21.5"
# Bus ids of the eight GPUs of an HGX H100 board, in two of the layouts vendors ship.
PCI_LAYOUTS = (
    ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db"),
    ("1b", "29", "3b", "4e", "9b", "a9", "bc", "cc"),
)
NIC_BUSES = ("0c", "1f", "41", "54", "8c", "9f", "c1", "d4")


def stamp(at: float) -> str:
    """ISO 8601 with milliseconds and Z, as the e2e training program prints."""
    moment = datetime.fromtimestamp(at, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def slurm_time(at: float) -> str:
    """Slurm's own time format in its messages (seconds, no zone)."""
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")


def node_number(host: str) -> int:
    digits = "".join(char for char in host if char.isdigit())
    return int(digits) if digits else 0


def node_ip(host: str) -> str:
    number = node_number(host)
    return f"10.{16 + number // 65536 % 200}.{number // 256 % 256}.{number % 256}"


def pci_bus(host: str, gpu: int) -> str:
    return PCI_LAYOUTS[node_number(host) % len(PCI_LAYOUTS)][gpu % GPUS_PER_NODE]


def rank_line(rank: int, at: float, host: str, message: str) -> str:
    return f"{rank}: {stamp(at)} {host}: {message}"


def host_line(at: float, host: str, message: str) -> str:
    return f"{stamp(at)} {host}: {message}"


# ---------------------------------------------------------------------------------- healthy


def startup_lines(
    *,
    hosts: list[str],
    at: float,
    restart: int,
    resume_step: int,
    checkpoint_dir: str,
    rng: random.Random,
) -> list[str]:
    """What every attempt prints before its first step: resume notice and NCCL set-up."""
    head = hosts[0]
    if resume_step > 0:
        said = f"resuming from checkpoint at iteration {resume_step} (restart {restart})"
        lines = [
            rank_line(
                0, at, head, f"loading checkpoint from {checkpoint_dir} at iteration {resume_step}"
            ),
            rank_line(0, at + 0.4, head, said),
        ]
    else:
        lines = [rank_line(0, at, head, f"starting from scratch (restart {restart})")]
    at += 0.8
    lines.append(
        rank_line(
            0,
            at,
            head,
            f"{head}:{_pid(rng)}:{_pid(rng)} [0] NCCL INFO NCCL version {NCCL_VERSION}+cuda12.4",
        )
    )
    nranks = len(hosts) * GPUS_PER_NODE
    for index, host in enumerate(hosts):
        rank = index * GPUS_PER_NODE
        pid = _pid(rng)
        tid = pid + rng.randint(40, 90)
        ip = node_ip(host)
        prefix = f"{host}:{pid}:{tid} [0] NCCL INFO"
        stamp_at = at + 0.01 * index
        lines.append(
            rank_line(
                rank,
                stamp_at,
                host,
                f"{host}:{pid}:{pid} [0] NCCL INFO Bootstrap : Using ib0:{ip}<0>",
            )
        )
        lines.append(
            rank_line(
                rank,
                stamp_at,
                host,
                f"{prefix} NET/IB : Using [0]mlx5_0:1/IB "
                f"[1]mlx5_1:1/IB [2]mlx5_2:1/IB [3]mlx5_3:1/IB ; OOB ib0:{ip}<0>",
            )
        )
        lines.append(
            rank_line(
                rank,
                stamp_at + 0.2,
                host,
                f"{prefix} Channel 00/32 : "
                f"{rank} -> {(rank + GPUS_PER_NODE) % nranks} via NET/IB/0",
            )
        )
        lines.append(
            rank_line(
                rank,
                stamp_at + 0.4,
                host,
                f"{prefix} comm 0x{rng.getrandbits(40):x} "
                f"rank {rank} nranks {nranks} cudaDev 0 busId "
                f"{pci_bus(host, 0)}000 - Init COMPLETE",
            )
        )
    return lines


def progress_line(
    *,
    rank: int,
    host: str,
    at: float,
    step: int,
    loss: float,
    tokens_per_second: float,
    memory_gib: float,
) -> str:
    """A torchtitan progress line: this rank's own loss view and compute throughput."""
    tflops = tokens_per_second * 0.0595
    mfu = tflops / 989.0 * 100
    return rank_line(
        rank,
        at,
        host,
        f"step: {step:5d}  loss: {loss:7.4f}  memory: {memory_gib:5.2f}GiB"
        f"({memory_gib / 79.1 * 100:.2f}%)  tps: {tokens_per_second:,.0f}  "
        f"tflops: {tflops:.2f}  mfu: {mfu:.2f}%",
    )


def training_loss(step: int, rng: random.Random) -> float:
    """A pre-training loss curve: fast early drop, slow tail, a little noise."""
    return 2.1 + 8.8 * math.exp(-step / 350) + 0.6 * math.exp(-step / 6000) + rng.gauss(0, 0.02)


def checkpoint_lines(*, host: str, at: float, step: int, checkpoint_dir: str) -> list[str]:
    """Megatron's save messages from rank 0; the second one, at ``at``, marks it complete."""
    return [
        rank_line(
            0, at - 0.9, host, f"saving checkpoint at iteration {step:8d} to {checkpoint_dir}"
        ),
        rank_line(
            0,
            at,
            host,
            f"successfully saved checkpoint from iteration {step:8d} to {checkpoint_dir}",
        ),
    ]


def finished_line(*, host: str, at: float, step: int) -> str:
    return rank_line(0, at, host, f"training finished at iteration {step}")


def thermal_lines(*, host: str, at: float, gpu: int) -> list[str]:
    """A node monitor noticing the slowdown; a warning, never a failure by itself."""
    return [host_line(at, host, f"GPU {gpu}: Clocks Event Reasons: HW Thermal Slowdown: Active")]


# ---------------------------------------------------------------------------------- failures


@dataclass
class FailureContext:
    """Where and when a failure happens; ``rng`` varies its details."""

    job_id: int
    hosts: list[str]
    node: int  # index in ``hosts`` of the node that fails (or of the rank that raises)
    step: int
    at: float
    rng: random.Random
    checkpoint_dir: str = "/checkpoints"
    xid: int | None = None

    @property
    def host(self) -> str:
        return self.hosts[self.node]

    @property
    def batch_host(self) -> str:
        return self.hosts[0]

    def gpu(self) -> int:
        return self.rng.randrange(GPUS_PER_NODE)

    def rank_of(self, gpu: int, node: int | None = None) -> int:
        return (self.node if node is None else node) * GPUS_PER_NODE + gpu

    def peers(self, count: int) -> list[tuple[int, str]]:
        """A few ranks on other nodes, as (rank, host)."""
        others = [index for index in range(len(self.hosts)) if index != self.node] or [self.node]
        chosen = []
        for _ in range(count):
            node = self.rng.choice(others)
            chosen.append(
                (node * GPUS_PER_NODE + self.rng.randrange(GPUS_PER_NODE), self.hosts[node])
            )
        return chosen


def failure_lines(kind: FaultKind, context: FailureContext) -> list[str]:
    """The lines a failure of ``kind`` leaves in the job's output."""
    return _TEMPLATES[kind.name](context)


def _pid(rng: random.Random) -> int:
    return rng.randint(2_000, 4_000_000)


def _traceback(frames: list[tuple[str, int, str, str]]) -> list[str]:
    lines = ["Traceback (most recent call last):"]
    for path, number, function, code in frames:
        lines.append(f'  File "{path}", line {number}, in {function}')
        lines.append(f"    {code}")
    return lines


_TRAIN = "/workspace/megatron/pretrain_gpt.py"
_TRAINING = "/workspace/megatron/megatron/training/training.py"
_TORCH = "/usr/local/lib/python3.11/site-packages/torch"


def _train_frames(rng: random.Random) -> list[tuple[str, int, str, str]]:
    return [
        (_TRAIN, rng.choice((312, 318, 334)), "<module>", "pretrain("),
        (
            _TRAINING,
            rng.choice((386, 391)),
            "pretrain",
            "iteration, num_floating_point_operations_so_far = train(",
        ),
        (_TRAINING, rng.choice((1346, 1352, 1402)), "train", "train_step(forward_step_func,"),
    ]


def _rank_block(
    context: FailureContext, rank: int, host: str, lines: list[str], at: float
) -> list[str]:
    return [rank_line(rank, at + 0.001 * index, host, line) for index, line in enumerate(lines)]


def _srun_exit(
    context: FailureContext, rank: int, host: str, what: str = "Exited with exit code 1"
) -> list[str]:
    return [
        f"srun: error: {host}: task {rank}: {what}",
        "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.",
    ]


def _step_cancelled(context: FailureContext) -> str:
    return (
        f"slurmstepd-{context.batch_host}: error: *** STEP {context.job_id}.0 ON "
        f"{context.batch_host} CANCELLED AT {slurm_time(context.at + 2)} ***"
    )


def _watchdog_timeouts(context: FailureContext, count: int, at: float) -> list[str]:
    """What the other ranks print when a peer stops taking part in collectives."""
    seq = context.rng.randint(20_000, 900_000)
    timeout_ms = context.rng.choice((600_000, 1_800_000))
    moment = datetime.fromtimestamp(at, tz=UTC)
    lines = []
    for rank, host in context.peers(count):
        lines.append(
            rank_line(
                rank,
                at,
                host,
                f"[rank{rank}]:[E{moment:%m%d} {moment:%H:%M:%S}.{moment.microsecond:06d} "
                f"{context.rng.randint(100_000, 999_999)} ProcessGroupNCCL.cpp:616] [Rank {rank}] "
                f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, "
                f"OpType=ALLREDUCE, NumelIn={context.rng.choice((1048576, 4194304, 67108864))}, "
                f"NumelOut=1048576, Timeout(ms)={timeout_ms}) ran for "
                f"{timeout_ms + context.rng.randint(5, 900)} milliseconds before timing out.",
            )
        )
    return lines


def _xid_line(context: FailureContext, gpu: int, code: int) -> str:
    bus = pci_bus(context.host, gpu)
    pid = _pid(context.rng)
    texts = {
        48: f"An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
        f"at partition {context.rng.randrange(12)}, subpartition {context.rng.randrange(2)}.",
        62: f"{context.rng.getrandbits(32):08x} {context.rng.getrandbits(32):08x} "
        f"{context.rng.getrandbits(32):08x} {context.rng.getrandbits(32):08x}",
        79: "GPU has fallen off the bus.",
        94: "Contained: SM (0x1). RST: No, D-RST: No",
        95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
        119: f"Timeout after 6s of waiting for RPC response from GPU{gpu} GSP! Expected function "
        f"76 (GSP_RM_CONTROL) (0x20802a02 0x{context.rng.choice((8, 16, 48)):x}).",
        120: f"GSP task exception: (cpuid={context.rng.randrange(4)} "
        f"pc=0x{context.rng.getrandbits(24):x}) ilp={context.rng.randrange(8)}.",
        31: f"Ch 0000000{context.rng.randrange(8)}, intr 00000000. MMU Fault: ENGINE GRAPHICS "
        f"GPCCLIENT_T1_{context.rng.randrange(4)} faulted @ 0x7f{context.rng.getrandbits(28):07x}_"
        f"{context.rng.getrandbits(16):04x}0000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    }
    return host_line(
        context.at,
        context.host,
        f"NVRM: Xid (PCI:0000:{bus}:00): {code}, pid={pid}, name=python, {texts[code]}",
    )


def _gpu_crash(context: FailureContext, exception: str) -> list[str]:
    gpu = context.gpu()
    rank = context.rank_of(gpu)
    code = context.xid or 79
    lines = [_xid_line(context, gpu, code)]
    if code == 79 and context.rng.random() < 0.5:
        lines.append(
            host_line(
                context.at + 0.5,
                context.host,
                "Unable to determine the device handle for GPU "
                f"0000:{pci_bus(context.host, gpu).upper()}:00.0: GPU is lost.  Reboot the "
                "system to recover this GPU",
            )
        )
    frames = [
        *_train_frames(context.rng),
        (f"{_TORCH}/_tensor.py", 648, "backward", "torch.autograd.backward("),
    ]
    lines += _rank_block(
        context, rank, context.host, [*_traceback(frames), exception], context.at + 0.2
    )
    lines += _watchdog_timeouts(context, context.rng.randint(1, 3), context.at + 1.0)
    lines += _srun_exit(context, rank, context.host)
    return lines


def _gpu_faulty(context: FailureContext) -> list[str]:
    return _gpu_crash(context, "RuntimeError: CUDA error: unspecified launch failure")


def _gpu_memory(context: FailureContext) -> list[str]:
    return _gpu_crash(
        context,
        context.rng.choice(
            (
                "torch.AcceleratorError: CUDA error: uncorrectable ECC error encountered",
                "RuntimeError: CUDA error: uncorrectable ECC error encountered",
            )
        ),
    )


def _gpu_gsp(context: FailureContext) -> list[str]:
    return _gpu_crash(context, "RuntimeError: CUDA error: unspecified launch failure")


def _app_exception(context: FailureContext) -> list[str]:
    rng = context.rng
    shard = rng.randrange(4096)
    variants = [
        (
            [
                (
                    "/workspace/megatron/megatron/core/datasets/gpt_dataset.py",
                    241,
                    "__getitem__",
                    "text, _ = self._query_document_sample_shuffle_indices(idx)",
                ),
                (
                    "/workspace/megatron/megatron/core/datasets/indexed_dataset.py",
                    612,
                    "get",
                    "sequence_pointer, sequence_length, sequence_mode = self.index[idx]",
                ),
            ],
            f"IndexError: index {rng.randint(10**6, 10**8)} is out of bounds for axis 0 with "
            f"size {rng.randint(10**5, 10**6)}",
        ),
        (
            [
                (
                    "/workspace/train/data.py",
                    88,
                    "__iter__",
                    "yield self.collate([self.samples[key] for key in keys])",
                )
            ],
            f"KeyError: 'shard-{shard:05d}/sample-{rng.randrange(10**6):06d}'",
        ),
        (
            [
                (
                    "/workspace/megatron/megatron/core/transformer/attention.py",
                    287,
                    "forward",
                    "query, key = apply_rotary_pos_emb(query, key, rotary_pos_emb)",
                )
            ],
            f"ValueError: Expected input batch_size ({rng.choice((8, 16, 32))}) to match target "
            f"batch_size ({rng.choice((12, 24, 48))}).",
        ),
        (
            [
                (
                    "/workspace/train/tokenizer.py",
                    51,
                    "encode",
                    'assert len(ids) <= self.max_length, f"sequence too long: {len(ids)}"',
                )
            ],
            f"AssertionError: sequence too long: {rng.randint(8193, 40000)}",
        ),
    ]
    frames, exception = variants[rng.randrange(len(variants))]
    rank = context.rank_of(rng.randrange(GPUS_PER_NODE))
    body = [*_traceback(_train_frames(rng) + frames), exception]
    lines = _rank_block(context, rank, context.host, body, context.at)
    lines += _srun_exit(context, rank, context.host)
    lines.append(_step_cancelled(context))
    return lines


def _cuda_error_app(context: FailureContext) -> list[str]:
    rng = context.rng
    gpu = context.gpu()
    rank = context.rank_of(gpu)
    frames = [
        *_train_frames(rng),
        (
            "/workspace/megatron/megatron/core/tensor_parallel/layers.py",
            247,
            "forward",
            "output_parallel = F.embedding(masked_input, self.weight)",
        ),
    ]
    if rng.random() < 0.5:
        kernel = rng.choice(
            ("Indexing.cu:1308: indexSelectLargeIndex", "IndexKernel.cu:92: operator()")
        )
        block = [
            f"../aten/src/ATen/native/cuda/{kernel}: block: [{rng.randrange(512)},0,0], thread: "
            f"[{rng.randrange(128)},0,0] Assertion `srcIndex < srcSelectDimSize` failed.",
            *_traceback(frames),
            "RuntimeError: CUDA error: device-side assert triggered",
        ]
        lines: list[str] = []
    else:
        block = [
            *_traceback(frames),
            "RuntimeError: CUDA error: an illegal memory access was encountered",
        ]
        lines = [_xid_line(context, gpu, 31)] if rng.random() < 0.5 else []
    block += [
        "CUDA kernel errors might be asynchronously reported at some other API call, so the "
        "stacktrace below might be incorrect.",
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
    ]
    lines += _rank_block(context, rank, context.host, block, context.at + 0.1)
    lines += _srun_exit(context, rank, context.host)
    lines.append(_step_cancelled(context))
    return lines


def _gpu_oom(context: FailureContext) -> list[str]:
    rng = context.rng
    gpu = context.gpu()
    rank = context.rank_of(gpu)
    wanted = rng.choice((1.25, 2.5, 3.91, 7.82, 15.64))
    free = rng.uniform(0.2, 1.2)
    body = [
        *_traceback(
            [
                *_train_frames(rng),
                (
                    f"{_TORCH}/nn/modules/module.py",
                    1747,
                    "_call_impl",
                    "return forward_call(*args, **kwargs)",
                ),
            ]
        ),
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {wanted:.2f} GiB. "
        f"GPU {gpu} has a total capacity of 79.10 GiB of which {free:.2f} GiB is free. "
        f"Including non-PyTorch memory, this process has {79.1 - free:.2f} GiB memory in use. "
        f"Of the allocated memory {rng.uniform(60, 70):.2f} GiB is allocated by PyTorch, and "
        f"{rng.uniform(1, 6):.2f} GiB is reserved by PyTorch but unallocated. If reserved but "
        "unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.",
    ]
    lines = _rank_block(context, rank, context.host, body, context.at)
    lines += _srun_exit(context, rank, context.host)
    lines.append(_step_cancelled(context))
    return lines


def _nan_divergence(context: FailureContext) -> list[str]:
    rng = context.rng
    head = context.hosts[0]
    lines = [
        rank_line(
            index * GPUS_PER_NODE,
            context.at,
            host,
            f"step: {context.step + 1:5d}  loss:     nan  memory: {rng.uniform(60, 70):5.2f}GiB"
            f"({rng.uniform(76, 88):.2f}%)  tps: {rng.randint(4800, 5400):,}  "
            "tflops: 0.00  mfu: 0.00%",
        )
        for index, host in enumerate(context.hosts)
    ]
    ending = rng.choice(
        (
            f"RuntimeError: Loss is NaN at iteration {context.step + 1}, stopping training",
            "FloatingPointError: Minimum loss scale reached (0.0001). Your loss is probably "
            "exploding. Try lowering the learning rate, using gradient clipping or increasing "
            "the batch size.",
            "RuntimeError: Rerun state machine: found NaN in local grad norm in backward pass "
            "before data-parallel communication collective",
        )
    )
    body = [*_traceback(_train_frames(rng)), ending]
    lines += _rank_block(context, 0, head, body, context.at + 0.1)
    lines += _srun_exit(context, 0, head)
    lines.append(_step_cancelled(context))
    return lines


def _segfault(context: FailureContext) -> list[str]:
    rng = context.rng
    gpu = context.gpu()
    rank = context.rank_of(gpu)
    thread = rng.getrandbits(44)
    body = [
        "Fatal Python error: Segmentation fault",
        "",
        f"Thread 0x{thread:012x} (most recent call first):",
        f'  File "{_TORCH}/utils/data/_utils/worker.py", line 309 in _worker_loop',
        f'  File "{_TRAINING}", line {rng.choice((1346, 1352))} in train',
    ]
    lines = _rank_block(context, rank, context.host, body, context.at)
    lines += _srun_exit(context, rank, context.host, "Segmentation fault")
    lines.append(_step_cancelled(context))
    return lines


def _host_oom(context: FailureContext) -> list[str]:
    rng = context.rng
    rank = context.rank_of(rng.randrange(GPUS_PER_NODE))
    lines = []
    if rng.random() < 0.5:
        lines += _rank_block(
            context,
            rank,
            context.host,
            [
                *_traceback(_train_frames(rng)),
                f"RuntimeError: DataLoader worker (pid {_pid(rng)}) is killed by signal: Killed.",
            ],
            context.at,
        )
    lines += [
        f"slurmstepd-{context.host}: error: Detected {rng.randint(1, 4)} oom_kill event in StepId="
        f"{context.job_id}.0. Some of your processes may have been killed by the cgroup "
        "out-of-memory handler.",
        f"srun: error: {context.host}: task {rank}: Out Of Memory",
        "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.",
    ]
    return lines


def _nccl_error(context: FailureContext) -> list[str]:
    rng = context.rng
    gpu = context.gpu()
    rank = context.rank_of(gpu)
    pid = _pid(rng)
    peer_host = context.hosts[(context.node + 1) % len(context.hosts)]
    lines = [
        rank_line(
            rank,
            context.at,
            context.host,
            f"{context.host}:{pid}:{pid + rng.randint(50, 400)} [{gpu}] misc/socket.cc:484 NCCL "
            f"WARN socketStartConnect: Connect to {node_ip(peer_host)}"
            f"<{rng.randint(30000, 60000)}> failed : Software caused connection abort",
        )
    ]
    body = [
        *_traceback(_train_frames(rng)),
        "torch.distributed.DistBackendError: NCCL error in: /opt/pytorch/pytorch/torch/csrc/"
        f"distributed/c10d/ProcessGroupNCCL.cpp:{rng.choice((1970, 2027, 3763))}, unhandled system "
        f"error (run with NCCL_DEBUG=INFO for details), NCCL version {NCCL_VERSION}",
        "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or "
        "device error.",
    ]
    lines += _rank_block(context, rank, context.host, body, context.at + 0.2)
    lines += _srun_exit(context, rank, context.host)
    lines.append(_step_cancelled(context))
    return lines


def _ib_link(context: FailureContext) -> list[str]:
    rng = context.rng
    gpu = context.gpu()
    rank = context.rank_of(gpu)
    pid = _pid(rng)
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
        *_traceback(_train_frames(rng)),
        "torch.distributed.DistBackendError: NCCL error in: /opt/pytorch/pytorch/torch/csrc/"
        "distributed/c10d/ProcessGroupNCCL.cpp:3763, remote process exited or there was a network "
        f"error, NCCL version {NCCL_VERSION}",
        "ncclRemoteError: A call failed possibly due to a network error or a remote process "
        "exiting prematurely.",
    ]
    lines += _rank_block(context, rank, context.host, body, context.at + 0.3)
    lines += _srun_exit(context, rank, context.host)
    lines.append(_step_cancelled(context))
    return lines


def _nic_fatal(context: FailureContext) -> list[str]:
    rng = context.rng
    gpu = context.gpu()
    rank = context.rank_of(gpu)
    bus = NIC_BUSES[rng.randrange(len(NIC_BUSES))]
    pid = _pid(rng)
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
    lines += _watchdog_timeouts(context, rng.randint(1, 3), context.at + 1.0)
    lines += _srun_exit(context, rank, context.host)
    lines.append(_step_cancelled(context))
    return lines


def _nccl_timeout(context: FailureContext) -> list[str]:
    rng = context.rng
    lines = _watchdog_timeouts(context, rng.randint(2, 6), context.at)
    rank, host = context.peers(1)[0]
    lines += _rank_block(
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


def _storage_io(context: FailureContext) -> list[str]:
    rng = context.rng
    head = context.hosts[0]
    target = f"{context.checkpoint_dir}/iter_{context.step + 1:07d}"
    ending = rng.choice(
        (
            f"OSError: [Errno 5] Input/output error: '{target}/mp_rank_00/model_optim_rng.pt'",
            f"OSError: [Errno 116] Stale file handle: '{target}'",
            "RuntimeError: [enforce fail at inline_container.cc:603] . PytorchStreamWriter failed "
            f"writing file data/{rng.randrange(4000)}: file write failed",
            f"OSError: [Errno 28] No space left on device: '{target}/mp_rank_00'",
        )
    )
    frames = [
        *_train_frames(rng),
        (f"{_TORCH}/serialization.py", 944, "save", "_save(obj, opened_zipfile, pickle_module)"),
    ]
    lines = [
        rank_line(
            0,
            context.at,
            head,
            f"saving checkpoint at iteration {context.step + 1:8d} to {context.checkpoint_dir}",
        )
    ]
    lines += _rank_block(context, 0, head, [*_traceback(frames), ending], context.at + 2.0)
    lines += _srun_exit(context, 0, head)
    lines.append(_step_cancelled(context))
    return lines


def _slurm_notice(context: FailureContext, why: str) -> list[str]:
    return [
        f"slurmstepd-{context.batch_host}: error: *** JOB {context.job_id} ON {context.batch_host} "
        f"CANCELLED AT {slurm_time(context.at)} DUE TO {why} ***"
    ]


def _node_death(context: FailureContext) -> list[str]:
    lines = [f"srun: error: Node failure on {context.host}"]
    if context.node != 0:
        # The batch step lives on the first node; when that node died, nobody is left to write.
        lines += [
            *_slurm_notice(context, "NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS"),
        ]
    return lines


def _preemption(context: FailureContext) -> list[str]:
    return _slurm_notice(context, "PREEMPTION")


def _time_limit(context: FailureContext) -> list[str]:
    return _slurm_notice(context, "TIME LIMIT")


def _no_text(context: FailureContext) -> list[str]:
    return []


def requeue_notice(*, job_id: int, batch_host: str, at: float) -> str:
    """What slurmstepd writes when a running job is requeued by hand."""
    return (
        f"slurmstepd-{batch_host}: error: *** JOB {job_id} ON {batch_host} CANCELLED AT "
        f"{slurm_time(at)} DUE TO JOB REQUEUE ***"
    )


def cancel_notice(*, job_id: int, batch_host: str, at: float) -> str:
    return (
        f"slurmstepd-{batch_host}: error: *** JOB {job_id} ON {batch_host} CANCELLED AT "
        f"{slurm_time(at)} ***"
    )


_TEMPLATES: dict[str, Callable[[FailureContext], list[str]]] = {
    "gpu_faulty": _gpu_faulty,
    "gpu_memory": _gpu_memory,
    "gpu_gsp": _gpu_gsp,
    "gpu_thermal": _no_text,
    "app_exception": _app_exception,
    "cuda_error_app": _cuda_error_app,
    "gpu_oom": _gpu_oom,
    "nan_divergence": _nan_divergence,
    "segfault": _segfault,
    "host_oom": _host_oom,
    "nccl_error": _nccl_error,
    "ib_link": _ib_link,
    "nic_fatal": _nic_fatal,
    "node_death": _node_death,
    "nccl_timeout": _nccl_timeout,
    "hang": _no_text,
    "storage_io": _storage_io,
    "preemption": _preemption,
    "time_limit": _time_limit,
}
